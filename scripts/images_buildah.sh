#!/bin/sh
# `make images` where no Docker engine runs: build deploy/image/Dockerfile with buildah, daemonless
# and rootless-free (root, chroot isolation, vfs storage: no kernel overlay or user namespaces
# needed). `apt-get install -y buildah debootstrap` first.
#
#   scripts/images_buildah.sh TAG PREFIX SERVICE...
#
# The base image: $PYTHON_IMAGE when set (a registry that serves it), else one made here from
# Debian bookworm packages with debootstrap (python3 3.11, pip, venv, ca-certificates; `python`
# and `pip` as the Dockerfile calls them), tagged localhost/toolbus-python-base:bookworm and built
# once. It trusts the building machine's CA bundle (/etc/ssl/certs/ca-certificates.crt, also as
# SSL_CERT_FILE for uv), so the build reaches PyPI the way this machine does.
set -eu
TAG=$1; PREFIX=$2; shift 2
S="--storage-driver vfs"
BASE=${PYTHON_IMAGE:-localhost/toolbus-python-base:bookworm}
if [ -z "${PYTHON_IMAGE:-}" ] && ! buildah $S inspect --type image "$BASE" >/dev/null 2>&1; then
  root=$(mktemp -d /var/tmp/toolbus-base.XXXXXX)
  echo "== base image $BASE from Debian bookworm (debootstrap into $root)"
  debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
    bookworm "$root" http://deb.debian.org/debian
  ln -sf python3 "$root/usr/bin/python"
  printf '[global]\nbreak-system-packages = true\n' > "$root/etc/pip.conf"
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*
  ctr=$(buildah $S from scratch)
  tar -C "$root" -cf - . | buildah $S add "$ctr" - /
  buildah $S config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt --cmd python3 "$ctr"
  buildah $S commit --rm "$ctr" "$BASE"
  rm -rf "$root"
fi
for s in "$@"; do
  echo "== $PREFIX$s:$TAG (buildah, base $BASE)"
  # docker format: OCI images have no HEALTHCHECK.
  buildah $S bud --isolation chroot --format docker -f deploy/image/Dockerfile \
    --build-arg PYTHON_IMAGE="$BASE" --build-arg SERVICE="$s" -t "$PREFIX$s:$TAG" .
done
buildah $S images
