#!/bin/sh
# Make the base image docker/Dockerfile builds FROM: a minimal Debian 12
# (bookworm) root file system made by debootstrap from Debian's own packages
# and loaded with `docker import`. No container registry is needed: the only
# network access is to Debian's package mirror.
#
#   sudo docker/base-image.sh [IMAGE]        # IMAGE defaults to bitroute-base:bookworm
#
# Needs root (debootstrap), debootstrap and a running Docker daemon
# (Debian: apt-get install debootstrap docker.io). MIRROR overrides the mirror.
# The image carries bookworm, bookworm-updates and bookworm-security in its apt
# sources: the Dockerfile's Rust (rustc-web, cargo-web) is newest in
# bookworm-security.
set -eu

IMAGE=${1:-bitroute-base:bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY=${SECURITY:-http://deb.debian.org/debian-security}

for tool in debootstrap docker; do
    command -v "$tool" >/dev/null || { echo "base-image.sh: '$tool' is not on PATH (apt-get install debootstrap docker.io)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "base-image.sh: debootstrap needs root" >&2; exit 1; }

ROOT=$(mktemp -d "${TMPDIR:-/tmp}/bitroute-base.XXXXXX")
trap 'rm -rf "$ROOT"' EXIT

# minbase: essential packages and apt only (no systemd, no man pages).
debootstrap --variant=minbase bookworm "$ROOT" "$MIRROR"

cat > "$ROOT/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb $SECURITY bookworm-security main
EOF
# As Debian's official images: no documentation, no recommended packages, and
# no package lists or caches left in a layer.
cat > "$ROOT/etc/apt/apt.conf.d/90bitroute-image" <<EOF
APT::Install-Recommends "false";
APT::Install-Suggests "false";
EOF
cat > "$ROOT/etc/dpkg/dpkg.cfg.d/90bitroute-image" <<EOF
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
EOF
chroot "$ROOT" apt-get clean
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/*.bin "$ROOT"/tmp/* "$ROOT"/var/log/*.log

tar --numeric-owner -C "$ROOT" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["bash"]' \
    --message "debootstrap --variant=minbase bookworm $MIRROR" \
    - "$IMAGE"
docker image ls "$IMAGE"
