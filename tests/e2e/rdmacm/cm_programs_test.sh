#!/usr/bin/env bash
# Debian's other unmodified rdmacm-utils programs between two processes,
# each its own host, on both engines:
#   ucmatose   10 RC connections, 100 messages of 4 KiB each way on each
#   udaddy     UD ids (SIDR), 4 of them, 50 messages of 1 KiB each
#   rdma_server / rdma_client   the synchronous API (rdma_getaddrinfo,
#              rdma_create_ep, rdma_post_* helpers of rdma_verbs.h)
#   cmtime     100 connections set up and torn down at once (its server
#              runs until killed)
#   cm_programs_test.sh RDMAEMU LIBRDMACM
source "$(dirname "$0")/rdmacm_lib.sh"
need ucmatose udaddy rdma_server rdma_client cmtime ss

for engine in uring epoll; do
  # --- ucmatose: several connections, several messages, 4 KiB
  a=$(new_host)
  name="$engine-ucmatose"
  start_server "$name" "$a" ucmatose -b "$a" -c 10 -C 100 -S 4096
  if client "$name" 0 ucmatose -s "$a" -c 10 -C 100 -S 4096; then
    wait_server "$name" 0
    for f in "$out" "$server_log"; do
      has "$name" "$f" '^data transfers complete$'
      has "$name" "$f" '^test complete$'
      has "$name" "$f" '^return status 0$'
      hasnt "$name" "$f" 'event: RDMA_CM_EVENT|failed|error'
      sane "$name" "$f"
    done
    has "$name server" "$server_log" '^disconnected$'
    echo "ok: $engine ucmatose -c 10 -C 100 -S 4096 in ${elapsed_ms} ms: $(tail -1 "$out")"
  else
    cleanup_server; server_pid=""
  fi

  # --- udaddy: UD (RDMA_PS_UDP, SIDR)
  a=$(new_host)
  name="$engine-udaddy"
  start_server "$name" "$a" udaddy -b "$a" -c 4 -C 50 -S 1024
  if client "$name" 0 udaddy -s "$a" -c 4 -C 50 -S 1024; then
    wait_server "$name" 0
    for f in "$out" "$server_log"; do
      has "$name" "$f" '^data transfers complete$'
      has "$name" "$f" '^test complete$'
      has "$name" "$f" '^return status 0$'
      hasnt "$name" "$f" 'event: RDMA_CM_EVENT|failed|error'
      sane "$name" "$f"
    done
    echo "ok: $engine udaddy -c 4 -C 50 -S 1024 in ${elapsed_ms} ms: $(tail -1 "$out")"
  else
    cleanup_server; server_pid=""
  fi

  # --- rdma_server / rdma_client: the synchronous API
  a=$(new_host)
  name="$engine-rdma_server"
  start_server "$name" "$a" rdma_server -s "$a"
  if client "$name" 0 rdma_client -s "$a"; then
    wait_server "$name" 0
    has "$name client" "$out" '^rdma_client: end 0$'
    has "$name server" "$server_log" '^rdma_server: end 0$'
    sane "$name client" "$out"
    sane "$name server" "$server_log"
    echo "ok: $engine rdma_server/rdma_client in ${elapsed_ms} ms"
  else
    cleanup_server; server_pid=""
  fi

  # --- cmtime: 100 connections (the server loops until killed)
  a=$(new_host)
  name="$engine-cmtime"
  start_server "$name" "$a" cmtime -b "$a"
  if client "$name" 0 cmtime -s "$a" -c 100; then
    stop_server "$name"
    for step in 'create id' 'resolve addr' 'resolve route' 'create qp' 'connect' 'disconnect' 'destroy'; do
      has "$name client" "$out" "^$step *: +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+\$"
    done
    hasnt "$name client" "$out" 'event: |ERROR|failure'
    hasnt "$name server" "$server_log" 'event: |ERROR|failure'
    sane "$name client" "$out"
    sane "$name server" "$server_log"
    echo "ok: $engine cmtime -c 100 in ${elapsed_ms} ms: $(grep '^connect ' "$out")"
  else
    cleanup_server; server_pid=""
  fi
done

finish
