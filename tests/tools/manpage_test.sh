#!/bin/bash
# The man pages against the things they describe:
#   (a) rdmaemu.1 and rdmaemu.3 render without a single warning: groff -ww
#       (all warnings), man -l at a few terminal widths, and mandoc -T lint
#       when mandoc is installed;
#   (b) every command of `rdmaemu --help`, and every option, action word and
#       RDMAEMU_* variable that `rdmaemu --help` and `rdmaemu COMMAND --help`
#       name, is in the rendered rdmaemu.1: each command has a subsection of
#       its own, each option is in that subsection or in OPTIONS, each
#       variable has an entry in ENVIRONMENT, each exit status of the main
#       help is in EXIT STATUS;
#   (c) every function rdmaemu.h declares (rdmaemu_*) is in the rendered
#       rdmaemu.3, in NAME, in SYNOPSIS as a prototype and in the text after
#       it, and so are the fields of struct rdmaemu_counters and the symbol
#       version node.
# Prints what is missing, a summary line, and exits non-zero on any failure.
# Usage: manpage_test.sh RDMAEMU_BINARY RDMAEMU_1 RDMAEMU_3 RDMAEMU_H
set -u
if [[ $# -ne 4 ]]; then
  echo "usage: $0 RDMAEMU_BINARY RDMAEMU_1 RDMAEMU_3 RDMAEMU_H" >&2
  exit 2
fi
tool="$1" page1="$2" page3="$3" header="$4"
export LC_ALL=C.UTF-8
# man-db's seccomp sandbox of its helpers fails in some containers and
# sandboxes; the pages are ours, nothing to confine.
export MAN_DISABLE_SECCOMP=1 MANPAGER=cat PAGER=cat
tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/manpage_test.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

checks=0
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
check() { checks=$((checks + 1)); }

for f in "$tool" "$page1" "$page3" "$header"; do
  [[ -r "$f" ]] || { echo "FAIL: cannot read $f"; echo "manpage_test: 0 checks, 1 failed"; exit 1; }
done
if ! command -v groff >/dev/null; then
  echo "FAIL: groff is not installed (Debian: apt-get install groff-base)"
  echo "manpage_test: 0 checks, 1 failed"
  exit 1
fi

# ---------------------------------------------------------------- (a) lint
# lint NAME OUTPUT_FILE CMD...: CMD must succeed and print nothing on stderr.
lint() {
  local name="$1" out="$2"
  shift 2
  check
  "$@" >"$out" 2>"$tmp/lint.err"
  local rc=$?
  if [[ $rc -ne 0 || -s "$tmp/lint.err" ]]; then
    fail "$name: exit status $rc, warnings:"
    sed 's/^/    /' "$tmp/lint.err" | head -20
  fi
}
for page in "$page1" "$page3"; do
  base="$(basename "$page")"
  lint "groff -man -ww -z $base" /dev/null groff -man -Tutf8 -ww -z "$page"
  if command -v man >/dev/null; then
    for width in 80 100; do
      lint "MANWIDTH=$width man --warnings=w -l $base" "$tmp/$base.man" \
        env MANWIDTH="$width" man --warnings=w -E UTF-8 -l "$page"
      check
      [[ -s "$tmp/$base.man" ]] || fail "man -l $base rendered nothing"
    done
  else
    echo "note: man is not installed; rendered with groff only"
  fi
  if command -v mandoc >/dev/null; then
    # mandoc -T lint prints its findings on stdout and exits 2 for warnings.
    check
    mandoc -T lint -W warning "$page" >"$tmp/$base.mandoc" 2>&1
    rc=$?
    if [[ $rc -ne 0 || -s "$tmp/$base.mandoc" ]]; then
      fail "mandoc -T lint -W warning $base: exit status $rc, warnings:"
      sed 's/^/    /' "$tmp/$base.mandoc" | head -20
    fi
  else
    echo "note: mandoc is not installed; mandoc -T lint skipped"
  fi
done

# The text the checks read: plain (no overstriking), lines wide enough that
# no option or name is broken, every kind of hyphen or minus an ASCII '-'.
render() {
  groff -man -Tutf8 -rLL=250n -P-cbou "$1" 2>/dev/null |
    sed -e 's/\xe2\x80\x90/-/g; s/\xe2\x80\x91/-/g; s/\xe2\x88\x92/-/g'
}
render "$page1" >"$tmp/page1.txt"
render "$page3" >"$tmp/page3.txt"

# section FILE TITLE: the lines of the section (.SH) TITLE, without its heading.
section() {
  awk -v t="$2" '/^[^ \t]/ { on = ($0 == t); next } on' "$1"
}
# subsection FILE TITLE: the lines of the subsection (.SS) TITLE.
subsection() {
  awk -v t="$2" '
    /^[^ \t]/ { on = 0; next }
    /^   [^ ]/ { on = ($0 == "   " t); next }
    on' "$1"
}
# has_word FILE WORD: WORD is in FILE, not as part of a longer name.
has_word() {
  local re
  re="$(printf '%s' "$2" | sed 's/[][\.*^$/+?(){}|]/\\&/g')"
  grep -qE -- "(^|[^A-Za-z0-9_-])${re}([^A-Za-z0-9_-]|$)" "$1"
}

for title in NAME SYNOPSIS DESCRIPTION OPTIONS COMMANDS ENVIRONMENT FILES "EXIT STATUS" EXAMPLES "SEE ALSO"; do
  check
  grep -qx -- "$title" "$tmp/page1.txt" || fail "rdmaemu.1 has no section $title"
done
for title in NAME SYNOPSIS DESCRIPTION "RETURN VALUE" ERRORS VERSIONS EXAMPLES "SEE ALSO"; do
  check
  grep -qx -- "$title" "$tmp/page3.txt" || fail "rdmaemu.3 has no section $title"
done

# ------------------------------------------------------ (b) rdmaemu.1 vs --help
check
if ! "$tool" --help >"$tmp/help.main" 2>"$tmp/help.err"; then
  fail "$tool --help failed:"
  sed 's/^/    /' "$tmp/help.err"
fi
# The commands: the first word of each line of the "Commands:" block.
mapfile -t commands < <(awk '/^Commands:/ { on = 1; next } on && /^$/ { exit } on { print $1 }' "$tmp/help.main")
check
if [[ ${#commands[@]} -lt 2 ]]; then
  fail "found ${#commands[@]} commands in '$tool --help' (the Commands: block moved?)"
fi

# Options a help text defines: the words of its Usage lines and the leading
# words of its indented option rows ("  -h, --help", "  --qp QPN  ...").
options_of() {
  {
    awk '/^Usage:/ { on = 1 } on && /^$/ { on = 0 } on' "$1"
    grep -E '^[[:space:]]+--?[A-Za-z]' "$1" | sed -E 's/^[[:space:]]+//; s/ {2,}.*//'
  } | grep -oE -- '(^|[][ ,|(])--?[A-Za-z][A-Za-z0-9-]*' | sed -E 's/^[][ ,|(]//' | sort -u
}
# Action words: the lower-case words of the Usage lines other than the
# command's name, and the rows of an "Actions:" block.
actions_of() {
  local cmd="$2"
  {
    awk '/^Usage:/ { on = 1 } on && /^$/ { on = 0 } on' "$1" | sed -E 's/^Usage://' |
      sed -E 's/[][ |]+/\n/g' | grep -E '^[a-z][a-z_]*$' | grep -vx -e rdmaemu -e "$cmd"
    awk '/^Actions:/ { on = 1; next } on && !/^  / { on = 0 } on && /^  [a-z]/ { print $1 }' "$1"
  } | sort -u
}

section "$tmp/page1.txt" OPTIONS >"$tmp/options.txt"
section "$tmp/page1.txt" ENVIRONMENT >"$tmp/environment.txt"
section "$tmp/page1.txt" "EXIT STATUS" >"$tmp/exit.txt"
cp "$tmp/help.main" "$tmp/help.all"

# The main help's own options (-h, --help, --version).
for opt in $(options_of "$tmp/help.main"); do
  check
  has_word "$tmp/options.txt" "$opt" || fail "rdmaemu.1: option $opt of 'rdmaemu --help' is not in OPTIONS"
done

for cmd in "${commands[@]}"; do
  check
  subsection "$tmp/page1.txt" "rdmaemu $cmd" >"$tmp/sub.$cmd"
  if [[ ! -s "$tmp/sub.$cmd" ]]; then
    fail "rdmaemu.1: command '$cmd' has no subsection 'rdmaemu $cmd' in COMMANDS"
  fi
  check
  has_word "$tmp/page1.txt" "$cmd" || fail "rdmaemu.1: command '$cmd' is not in the page"
  if [[ "$cmd" == help ]]; then
    # `rdmaemu help` is the help; `rdmaemu help --help` is not a thing.
    continue
  fi
  check
  if ! "$tool" "$cmd" --help >"$tmp/help.$cmd" 2>"$tmp/help.err"; then
    fail "'$tool $cmd --help' failed:"
    sed 's/^/    /' "$tmp/help.err"
    continue
  fi
  cat "$tmp/help.$cmd" >>"$tmp/help.all"
  cat "$tmp/sub.$cmd" "$tmp/options.txt" >"$tmp/where.$cmd"
  opts=$(options_of "$tmp/help.$cmd")
  check
  [[ -n "$opts" ]] || fail "found no option in '$tool $cmd --help' (every command has -h, --help)"
  for opt in $opts; do
    check
    has_word "$tmp/page1.txt" "$opt" || { fail "rdmaemu.1: option $opt of 'rdmaemu $cmd' is not in the page"; continue; }
    check
    has_word "$tmp/where.$cmd" "$opt" ||
      fail "rdmaemu.1: option $opt of 'rdmaemu $cmd' is neither in subsection 'rdmaemu $cmd' nor in OPTIONS"
  done
  for word in $(actions_of "$tmp/help.$cmd" "$cmd"); do
    check
    has_word "$tmp/sub.$cmd" "$word" || fail "rdmaemu.1: action '$word' of 'rdmaemu $cmd' is not in subsection 'rdmaemu $cmd'"
  done
done

# Every RDMAEMU_* variable any help text names has an ENVIRONMENT entry.
for var in $(grep -oE 'RDMAEMU_[A-Z][A-Z0-9_]*' "$tmp/help.all" | sort -u); do
  check
  grep -qx -- "       $var" "$tmp/environment.txt" || fail "rdmaemu.1: $var (named by --help) has no entry in ENVIRONMENT"
done
# Every exit status the main help names is in EXIT STATUS.
for status in $(awk '/^Exit status:/ { on = 1 } on && /^$/ { exit } on' "$tmp/help.main" | grep -oE '\b[0-9]+\b' | sort -u); do
  check
  has_word "$tmp/exit.txt" "$status" || fail "rdmaemu.1: exit status $status (named by --help) is not in EXIT STATUS"
done

# ------------------------------------------------------ (c) rdmaemu.3 vs header
mapfile -t functions < <(grep -oE '\brdmaemu_[a-z0-9_]+[[:space:]]*\(' "$header" | sed -E 's/[[:space:]]*\($//' | sort -u)
check
[[ ${#functions[@]} -gt 0 ]] || fail "found no rdmaemu_* function in $header"
section "$tmp/page3.txt" NAME >"$tmp/name3.txt"
section "$tmp/page3.txt" SYNOPSIS >"$tmp/synopsis3.txt"
awk '/^SYNOPSIS$/ { s = 1; next } s && /^[^ \t]/ { on = 1 } on' "$tmp/page3.txt" >"$tmp/body3.txt"
for fn in "${functions[@]}"; do
  check
  has_word "$tmp/name3.txt" "$fn" || fail "rdmaemu.3: $fn is not in NAME"
  check
  grep -qE -- "(^|[^A-Za-z0-9_])${fn}\(" "$tmp/synopsis3.txt" || fail "rdmaemu.3: $fn has no prototype in SYNOPSIS"
  check
  has_word "$tmp/body3.txt" "$fn" || fail "rdmaemu.3: $fn is not described after SYNOPSIS"
done
# The fields of struct rdmaemu_counters.
for field in $(awk '/^struct rdmaemu_counters \{/ { on = 1; next } on && /^\};/ { exit } on' "$header" |
               grep -oE '^[[:space:]]*uint[0-9]+_t[[:space:]]+[a-z0-9_]+' | awk '{ print $2 }'); do
  check
  has_word "$tmp/page3.txt" "$field" || fail "rdmaemu.3: field $field of struct rdmaemu_counters is not in the page"
done
# The symbol version node the header names.
for node in $(grep -oE '\bRDMAEMU_[0-9]+\.[0-9]+\b' "$header" | sort -u); do
  check
  has_word "$tmp/page3.txt" "$node" || fail "rdmaemu.3: version node $node is not in the page"
done

if [[ $failures -eq 0 ]]; then
  echo "PASS: manpage_test: $checks checks: ${#commands[@]} commands, ${#functions[@]} functions; pages render without warnings"
  exit 0
fi
echo "FAIL: manpage_test: $checks checks, $failures failed"
exit 1
