#!/usr/bin/env bash
# Installs a gitplane .deb for real with dpkg, upgrades, removes and purges it, without changing
# this machine: everything runs in a private mount namespace where /usr, /etc, /var, /srv and
# /run are overlays whose changes go to a scratch folder, dropped at the end. Checks what a user
# finds after each step: the binary on PATH, the `gitplane` user and group, /var/lib/gitplane
# (gitplane, 0700), the conffile, the packaged binary validating a repository as that user with
# the packaged config, the state kept on remove and gone on purge.
#
#   scripts/try-deb-install.sh target/debian/gitplane_0.1.0-1_amd64.deb
#
# Needs root, unshare(1) and overlayfs (a CI container as root has them); it says so and exits 3
# where it cannot run, which .ci/run reports as skipped.
set -euo pipefail

deb="$(realpath "${1:?usage: scripts/try-deb-install.sh PATH.deb}")"

if [ -z "${GITPLANE_TRY_INSIDE:-}" ]; then
  if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null; then
    echo "try-deb-install: needs root and unshare(1): skipped" >&2
    exit 3
  fi
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  # A probe first: a kernel or container without overlayfs in a user's namespace says no here.
  if ! unshare -m --propagation private sh -c \
    "mkdir -p '$work/p/u' '$work/p/w' && mount -t overlay overlay \
     -o lowerdir=/srv,upperdir='$work/p/u',workdir='$work/p/w' /srv" 2>/dev/null; then
    echo "try-deb-install: no overlayfs in a private mount namespace here: skipped" >&2
    exit 3
  fi
  GITPLANE_TRY_INSIDE="$work" unshare -m --propagation private "$0" "$deb"
  exit $?
fi

# --- Inside the namespace from here on ---
work="$GITPLANE_TRY_INSIDE"
for dir in usr etc var srv run; do
  mkdir -p "$work/$dir.upper" "$work/$dir.work"
  mount -t overlay overlay \
    -o "lowerdir=/$dir,upperdir=$work/$dir.upper,workdir=$work/$dir.work" "/$dir"
done
fail() { echo "try-deb-install: $*" >&2; exit 1; }
step() { echo "-- $*"; }

step "dpkg -i (fresh)"
getent passwd gitplane >/dev/null && fail "a gitplane user exists before the install"
dpkg -i "$deb" >/dev/null
[ "$(command -v gitplane)" = /usr/bin/gitplane ] || fail "gitplane is not /usr/bin/gitplane on PATH"
gitplane --version
getent passwd gitplane | grep -q ':/var/lib/gitplane:/usr/sbin/nologin$' \
  || fail "user: $(getent passwd gitplane)"
getent group gitplane >/dev/null || fail "no gitplane group"
[ "$(stat -c '%U:%G %a' /var/lib/gitplane)" = "gitplane:gitplane 700" ] \
  || fail "/var/lib/gitplane: $(stat -c '%U:%G %a' /var/lib/gitplane)"
[ -f /usr/lib/systemd/system/gitplane.service ] || fail "no unit"
dpkg-query -W -f='${Conffiles}\n' gitplane | grep -q /etc/gitplane/gitplane.yaml \
  || fail "/etc/gitplane/gitplane.yaml is not a registered conffile"

step "the service's user validates the repository the packaged config names"
install -d -m 0755 /srv/git
git init -q --bare --initial-branch=main /srv/git/platform.git
gitplane init "$work/platform" >/dev/null
git -C "$work/platform" push -q /srv/git/platform.git HEAD:main
chmod -R a+rX /srv/git/platform.git
runuser -u gitplane -- gitplane validate --config /etc/gitplane/gitplane.yaml \
  | grep '^ok: commit' || fail "validate as gitplane with the packaged config"

step "an edited config and the state survive an upgrade (dpkg -i again)"
echo "# edited" >> /etc/gitplane/gitplane.yaml
echo state > /var/lib/gitplane/state.db
dpkg -i --force-confold "$deb" >/dev/null
grep -q '^# edited$' /etc/gitplane/gitplane.yaml || fail "the upgrade replaced the edited config"
[ -f /var/lib/gitplane/state.db ] || fail "the upgrade lost the state"

step "dpkg -r keeps the state and the config"
dpkg -r gitplane >/dev/null
[ ! -e /usr/bin/gitplane ] || fail "the binary is still there after remove"
[ -f /var/lib/gitplane/state.db ] || fail "remove deleted the state"
[ -f /etc/gitplane/gitplane.yaml ] || fail "remove deleted the config"

step "dpkg -P deletes the state and the config; the user stays"
dpkg -P gitplane >/dev/null
[ ! -e /var/lib/gitplane ] || fail "purge left /var/lib/gitplane"
[ ! -e /etc/gitplane/gitplane.yaml ] || fail "purge left the config"
getent passwd gitplane >/dev/null || fail "purge removed the user"
echo "try-deb-install: $deb: ok (install, upgrade, remove, purge; this machine unchanged)"
