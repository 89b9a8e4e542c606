#!/usr/bin/env bash
# Builds a gitplane release into dist/: the release binary, then
#
#   dist/gitplane-<version>-x86_64-linux.tar.gz   the binary, the systemd unit, the example host
#                                                 config, LICENSE, README, CHANGELOG, SECURITY, docs/
#   dist/gitplane_<version>-1_amd64.deb           the Debian package (cargo deb, release profile)
#   dist/SHA256SUMS                               `sha256sum -c SHA256SUMS` checks both
#
# Run it from a clean checkout of the commit to release, on x86_64 Linux with cargo-deb
# installed (`cargo install cargo-deb --version 3.8.0 --locked`). A release build takes several
# minutes on 2 cores: CI does not run this script (.ci/run only checks that it parses, and
# builds and checks a .deb of the debug binary instead).
set -euo pipefail
cd "$(dirname "$0")/.."

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)"
[ -n "$version" ] || { echo "release: no version in Cargo.toml's [workspace.package]" >&2; exit 1; }
[ "$(uname -m)" = x86_64 ] || { echo "release: builds x86_64 artifacts; this is $(uname -m)" >&2; exit 1; }
command -v cargo-deb >/dev/null || {
  echo "release: cargo-deb is missing: cargo install cargo-deb --version 3.8.0 --locked" >&2
  exit 1
}

# The binary names its commit (gitplane --version); uncommitted changes would not be in it.
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  echo "release: warning: the checkout has uncommitted changes; the binary names $(git rev-parse --short=12 HEAD)" >&2
fi
if ! grep -q "^## \[$version\]" CHANGELOG.md; then
  echo "release: warning: CHANGELOG.md has no '## [$version]' section yet (rename [Unreleased])" >&2
fi

target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
# Archive times from the commit, so the same commit gives the same tarball.
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}"

step() { # NAME COMMAND...: run it and say how long it took
  local start=$SECONDS
  echo "== $1"
  shift
  "$@"
  echo "   ($((SECONDS - start)) s)"
}

step "cargo build --release --locked" cargo build --release --locked -p gitplane
binary="$target_dir/release/gitplane"
"$binary" --version

rm -rf dist
mkdir -p dist

name="gitplane-$version-x86_64-linux"
tarball() {
  local stage
  stage="$(mktemp -d)"
  local dir="$stage/$name"
  mkdir -p "$dir/systemd"
  # Stripped as the .deb's is: symbols are most of a release binary's size.
  strip --strip-unneeded -o "$dir/gitplane" "$binary"
  install -m 0644 systemd/gitplane.service systemd/README.md "$dir/systemd/"
  install -m 0644 packaging/gitplane.yaml "$dir/gitplane.yaml"
  install -m 0644 LICENSE README.md CHANGELOG.md SECURITY.md "$dir/"
  cp -R docs "$dir/docs"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" \
    -C "$stage" -czf "dist/$name.tar.gz" "$name"
  rm -rf "$stage"
  # What a user unpacks runs and names this version.
  local check
  check="$(mktemp -d)"
  tar -xzf "dist/$name.tar.gz" -C "$check"
  "$check/$name/gitplane" --version | grep -q "^gitplane $version " || {
    echo "release: the tarball's binary does not name $version" >&2
    exit 1
  }
  echo "$(tar -tzf "dist/$name.tar.gz" | wc -l) entries; $name/gitplane --version ok"
  rm -rf "$check"
}
step "dist/$name.tar.gz" tarball

step "Debian package (cargo deb, release profile)" \
  cargo deb -p gitplane --locked --no-build -o dist/
deb="dist/gitplane_${version}-1_amd64.deb"
step "check the package" scripts/check-deb.sh "$deb"

(cd dist && sha256sum "$name.tar.gz" "$(basename "$deb")" > SHA256SUMS && sha256sum -c SHA256SUMS)
echo "== dist/"
ls -l dist
cat dist/SHA256SUMS
