#!/usr/bin/env bash
# Screenshot an omni-export report.html with headless Chromium, to check what a person sees.
#
#   tools/screenshot_report.sh OUT_DIR/report.html [PNG] [WIDTHxHEIGHT]
#
# PNG defaults to report.png beside the HTML; the window defaults to 1400x3000. Needs Debian's
# chromium (apt-get install -y chromium) or CHROMIUM=/path/to/chrome. Networking, sync and
# component updates are off: the page must render from the file alone (inline CSS and images).
# Exit 2 on bad usage or a missing browser, else Chromium's status (and 1 if no PNG appeared).
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 3 ] || [ ! -f "$1" ]; then
  echo "usage: $0 REPORT.html [PNG] [WIDTHxHEIGHT]  (the HTML must exist)" >&2
  exit 2
fi
html=$(realpath "$1")
png=${2:-$(dirname "$html")/report.png}
size=${3:-1400x3000}
browser=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)}
if [ -z "$browser" ]; then
  echo "$0: no chromium found; install it (apt-get install -y chromium) or set CHROMIUM" >&2
  exit 2
fi

profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
rm -f "$png"
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --hide-scrollbars --user-data-dir="$profile" --screenshot="$png" \
  --window-size="${size/x/,}" "file://$html" >/dev/null 2>&1
if [ ! -s "$png" ]; then
  echo "$0: chromium wrote no screenshot to $png" >&2
  exit 1
fi
echo "$png"
