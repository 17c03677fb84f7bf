#!/usr/bin/env bash
# Stands in for ssh in tests: 'fake_ssh.sh HOST COMMAND' runs COMMAND here, with this stdin, as
# sshd would run it on HOST (every test host is 127.0.0.1).
set -eu
shift
exec bash -c "$1"
