#!/bin/sh
# The rollstream image without any registry: the route used where Docker Hub and PyPI's
# big wheels are out of reach (like the sandbox image, services/infra/image.py).
#
#   deploy/rollstream/build-debootstrap.sh [TAG]      (default rollstream:0.1.0; as root)
#
# 1. debootstrap a Debian minbase tree with a JRE (the Kafka nodes), redis-server and the
#    shared libraries a CPython build needs; cached under $CACHE (built once).
# 2. One tar stream: that tree + this machine's Python environment at its own absolute
#    paths (the venv and the interpreter it was made from, so nothing is re-downloaded)
#    + this checkout at /opt/rollstream + the Kafka jars `rollstream up` fetched, at
#    /opt/kafka/lib; `docker import` with the same ENV/ENTRYPOINT as the Dockerfile.
#
# VENV (default: .venv of the checkout, else /work/main/.venv), CACHE (default
# ~/.cache/rollstream), MIRROR (default: the first of this machine's apt sources),
# SUITE (bookworm: its python3 ABI matches no matter; the venv brings its own CPython).
set -eu
REPO=$(cd "$(dirname "$0")/../.." && pwd)
TAG=${1:-rollstream:0.1.0}
CACHE=${CACHE:-$HOME/.cache/rollstream}
SUITE=${SUITE:-bookworm}
VENV=${VENV:-$REPO/.venv}
[ -f "$VENV/pyvenv.cfg" ] || VENV=/work/main/.venv
VENV=$(cd "$VENV" && pwd -P)
PYHOME=$(sed -n 's/^home = //p' "$VENV/pyvenv.cfg")
PYPREFIX=$(cd "$PYHOME/.." && pwd -P)
KAFKA_VERSION=$(PYTHONPATH=$REPO "$VENV/bin/python" -c \
  'from services.settings import load; print(load().kafka.version)')
KAFKA_LIB=$CACHE/kafka-$KAFKA_VERSION/lib
[ -f "$KAFKA_LIB/.complete" ] || { echo "no Kafka jars in $KAFKA_LIB: run \`rollstream up --only kafka\` once" >&2; exit 1; }
if [ -z "${MIRROR:-}" ]; then
  MIRROR=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
    | awk '$1 == "deb" {print $2; exit}')
  [ -n "$MIRROR" ] || MIRROR=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | awk '$1 == "URIs:" {print $2; exit}')
fi
TREE=$CACHE/rollstream-image-rootfs/$SUITE
PACKAGES=openjdk-17-jre-headless,redis-server,ca-certificates,libssl3,libffi8,libsqlite3-0,liblzma5,libbz2-1.0,zlib1g,libgomp1,procps
if [ ! -f "$TREE/.complete" ]; then
  rm -rf "$TREE.partial"
  mkdir -p "$(dirname "$TREE")"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$TREE.partial" "$MIRROR"
  rm -rf "$TREE.partial/var/lib/apt/lists/"* "$TREE.partial/var/cache/apt/archives/"*.deb
  touch "$TREE.partial/.complete"
  rm -rf "$TREE" && mv "$TREE.partial" "$TREE"
fi
rel() { printf '%s' "${1#/}"; }
# The venv keeps its own absolute path. When it is the checkout's own .venv (the default),
# it comes with the checkout's tree and is kept out of the /opt/rollstream rename.
if [ "$VENV" = "$(cd "$REPO" && pwd -P)/.venv" ]; then
  VENV_MEMBER= ; VENV_EXCLUDE=@none@
else
  VENV_MEMBER=$(rel "$VENV") ; VENV_EXCLUDE="$(rel "$REPO")/.venv"
fi
echo "importing $TAG: $TREE + $PYPREFIX + $VENV + $REPO -> /opt/rollstream" >&2
# shellcheck disable=SC2086 # VENV_MEMBER is empty or one path without spaces
tar -cf - --numeric-owner \
    --exclude=./.complete -C "$TREE" . \
    --exclude="$(rel "$REPO")/.git" --exclude="$(rel "$REPO")/runs" \
    --exclude="$VENV_EXCLUDE" --exclude="$(rel "$REPO")/.mypy_cache" \
    --transform="s,^$(rel "$VENV"),@venv@," \
    --transform="s,^$(rel "$REPO"),opt/rollstream," \
    --transform="s,^@venv@,$(rel "$VENV")," \
    --transform="s,^$(rel "$KAFKA_LIB"),opt/kafka/lib," \
    -C / "$(rel "$PYPREFIX")" $VENV_MEMBER "$(rel "$REPO")" "$(rel "$KAFKA_LIB")" \
  | docker import \
    --change "ENV PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change "ENV PYTHONPATH=/opt/rollstream PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 KAFKA_LIB=/opt/kafka/lib" \
    --change "ENV ROLLSTREAM__STACK__STATE_DIR=/var/lib/rollstream ROLLSTREAM__STACK__CACHE_DIR=/var/cache/rollstream" \
    --change "LABEL rollstream.image=rollstream" \
    --change "WORKDIR /opt/rollstream" \
    --change 'ENTRYPOINT ["/opt/rollstream/deploy/rollstream/entrypoint.sh"]' \
    - "$TAG"
docker run --rm "$TAG" --help > /dev/null && echo "built $TAG" >&2
