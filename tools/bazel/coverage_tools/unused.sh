#!/bin/sh
echo "coverage is not supported in rdmaemu" >&2
exit 1
