#!/bin/sh
# Turns a Debian root filesystem with python3 into the rollstream sandbox image.
# Runs inside the image in both build paths: `RUN` of the Dockerfile, and chroot over
# the debootstrap tree (services/infra/image.py). Keep it POSIX sh with coreutils only.
set -eu

# The unprivileged user every job runs as (no shell, no password, no home to speak of).
grep -q '^sandbox:' /etc/group || echo 'sandbox:x:10001:' >> /etc/group
grep -q '^sandbox:' /etc/passwd ||
  echo 'sandbox:x:10001:10001:rollstream sandbox:/nonexistent:/usr/sbin/nologin' >> /etc/passwd

# Executor and helpers baked in (read-only root at run time), byte-compiled now: at run
# time nothing can write a cache, and compiling them again costs every job milliseconds.
mkdir -p /opt/rollstream /work
chmod 0755 /opt/rollstream
python3 -m compileall -q /opt/rollstream
chmod 1777 /work

# Nothing a job could use to escalate or phone home.
find / -xdev -perm /6000 -type f -exec chmod a-s {} + 2>/dev/null || true
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb \
  /usr/share/doc/* /usr/share/man/* /usr/share/info/* /usr/share/locale/* 2>/dev/null || true
