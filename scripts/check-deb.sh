#!/usr/bin/env bash
# Checks a gitplane .deb as an installer would find it, without installing it (`dpkg -i` would
# change this machine): its file list and modes, its control fields and conffiles, its maintainer
# scripts' syntax, and, unpacked into a scratch folder, that its binary runs, its unit starts
# that binary with the config the package ships, and that config parses.
#
#   scripts/check-deb.sh target/debian/gitplane_0.1.0-1_amd64.deb
#
# .ci/run runs it on the package built from the debug binary; scripts/release.sh on the release.
set -euo pipefail

deb="${1:?usage: scripts/check-deb.sh PATH.deb}"
cd "$(dirname "$0")/.."
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)"
fail() { echo "check-deb: $deb: $*" >&2; exit 1; }

# --- The file list: every path the README, the unit and the docs say the package installs ---
contents="$(dpkg-deb -c "$deb")"
want_mode() { # MODE PATH: PATH is in the package with that mode
  grep -Eq "^$1 (root/root|0/0) +[0-9]+ [0-9-]+ [0-9:]+ \./$2\$" <<<"$contents" \
    || fail "no ./$2 with mode $1 in:"$'\n'"$contents"
}
want_mode -rwxr-xr-x usr/bin/gitplane
want_mode -rw-r--r-- usr/lib/systemd/system/gitplane.service
want_mode -rw-r--r-- etc/gitplane/gitplane.yaml
for doc in copyright README.md CHANGELOG.md SECURITY.md ARCHITECTURE.md schema.sql \
  docs/host-config.md docs/daemon.md docs/service.md docs/security.md docs/cli.md \
  systemd/README.md; do
  want_mode -rw-r--r-- "usr/share/doc/gitplane/$doc"
done
# Every file of docs/ in the source is shipped, in its folder.
while IFS= read -r page; do
  want_mode -rw-r--r-- "usr/share/doc/gitplane/$page"
done < <(find docs -type f)
# Nothing under /usr/local (a package must not write there) or the state directory (the
# postinst makes it; a packaged file there would be removed with the package).
if grep -Eq '\./(usr/local|var/lib/gitplane)/' <<<"$contents"; then
  fail "installs under /usr/local or /var/lib/gitplane"
fi

# --- Control fields ---
field() { dpkg-deb -f "$deb" "$1"; }
[ "$(field Package)" = gitplane ] || fail "Package: $(field Package)"
[ "$(field Version)" = "$version-1" ] || fail "Version: $(field Version), want $version-1"
[ "$(field Architecture)" = amd64 ] || fail "Architecture: $(field Architecture)"
[ "$(field Section)" = admin ] || fail "Section: $(field Section)"
grep -q 'libc6' <<<"$(field Depends)" || fail "Depends does not name libc6: $(field Depends)"
grep -q 'passwd' <<<"$(field Depends)" || fail "Depends does not name passwd (useradd): $(field Depends)"
[ -n "$(field Maintainer)" ] || fail "no Maintainer"
[ -n "$(field Description)" ] || fail "no Description"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
dpkg-deb -e "$deb" "$scratch/control"
dpkg-deb -x "$deb" "$scratch/root"

# The config under /etc is a conffile: an administrator's edits survive upgrades.
grep -qx /etc/gitplane/gitplane.yaml "$scratch/control/conffiles" \
  || fail "/etc/gitplane/gitplane.yaml is not a conffile"

# --- Maintainer scripts: they parse, and they do what their comments promise ---
for script in preinst postinst prerm postrm; do
  [ -e "$scratch/control/$script" ] || continue
  sh -n "$scratch/control/$script" || fail "$script does not parse"
done
grep -q 'useradd --system' "$scratch/control/postinst" || fail "postinst makes no system user"
grep -q 'systemctl --system daemon-reload' "$scratch/control/postinst" \
  || fail "postinst does not reload systemd"
# /var/lib/gitplane goes only on purge: the rm must sit inside the purge branch.
awk '/^if \[ "\$1" = "purge" \]; then$/ {inside = 1} inside && /^fi$/ {inside = 0}
     /rm -rf \/var\/lib\/gitplane/ {found = 1; if (!inside) bad = 1}
     END {exit (found && !bad) ? 0 : 1}' "$scratch/control/postrm" \
  || fail "postrm removes /var/lib/gitplane outside purge (or not at all)"

# --- The unpacked package: the unit runs the packaged binary with the packaged config ---
root="$scratch/root"
exec_start="$(sed -n 's/^ExecStart=//p' "$root/usr/lib/systemd/system/gitplane.service")"
read -r binary _ _ config <<<"$exec_start"
[ -x "$root$binary" ] || fail "the unit's ExecStart names $binary, which the package does not install"
[ -f "$root$config" ] || fail "the unit's --config names $config, which the package does not install"

"$root/usr/bin/gitplane" --version | grep -q "^gitplane $version " \
  || fail "usr/bin/gitplane --version does not name $version"

# The shipped config parses: read as is it names the repository it watches (absent here), and
# with --repo pointing at a real repository it validates that repository's commit.
out="$("$root$binary" validate --config "$root$config" 2>&1)" && fail "validate passed without the repository"
grep -q "/srv/git/platform.git" <<<"$out" || fail "the shipped config does not load: $out"
"$root$binary" init "$scratch/platform" >/dev/null
"$root$binary" validate --config "$root$config" --repo "$scratch/platform" | grep -q '^ok: commit' \
  || fail "the shipped config does not validate a repository"

echo "check-deb: $deb: ok ($(wc -l <<<"$contents") entries, version $version-1)"
