#!/bin/sh
# Takes the status page's screenshots in docs/ (status-page*.png) with headless Chromium: the
# status page's browser tests, run with GITPLANE_SCREENSHOT=1, save what they look at (the
# window, 1200×760 or smaller, or one part of the page cropped to its box).
#
# Needs /usr/bin/chromium and chromedriver. Run from anywhere in the repository:
#   scripts/status-page-screenshots.sh
set -eu
cd "$(dirname "$0")/.."
if [ ! -x /usr/bin/chromium ] || ! command -v chromedriver >/dev/null; then
    echo "status-page-screenshots: needs /usr/bin/chromium and chromedriver" >&2
    exit 1
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if ! GITPLANE_SCREENSHOT=1 cargo test -p gitplane --test e2e -- \
    status_page::the_page_follows_a_push_draws_every_resource_and_shows_no_secret \
    status_page::the_page_shows_a_pin_a_failed_app_and_its_blocked_workload \
    status_page::the_login_page_names_the_token_file \
    --exact --nocapture --test-threads=1 >"$out" 2>&1; then
    cat "$out" >&2
    echo "status-page-screenshots: a test failed; no screenshot is to be trusted" >&2
    exit 1
fi
grep '^saved ' "$out"
