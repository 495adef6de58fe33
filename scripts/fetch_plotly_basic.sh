#!/usr/bin/env bash
# Fetch plotly.js-basic-dist-min 4.1.1 (MIT; bar, pie and scatter traces: every chart tracekit draws)
# from the npm registry into tracekit's asset cache, where `tracekit report` / `study` find it and
# inline it instead of plotly.py's full bundle: a self-contained page of ~1.3 MB instead of ~4.9 MB.
# Not committed to the repository (it is another project's code); checked against its sha256.
set -euo pipefail
version=4.1.1
sha=99784e3abfb07b142a15e521a439e6d9addceadb3f79553fd24c72774f0649ba
dest="${XDG_CACHE_HOME:-$HOME/.cache}/tracekit/assets"
file="$dest/plotly-basic-$version.min.js"
if [ -f "$file" ] && echo "$sha  $file" | sha256sum -c --quiet 2>/dev/null; then exit 0; fi
command -v npm >/dev/null || { echo "fetch_plotly_basic: npm not found: reports inline plotly.py's full bundle" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "plotly.js-basic-dist-min@$version" >/dev/null && tar xzf "plotly.js-basic-dist-min-$version.tgz")
echo "$sha  $tmp/package/plotly-basic.min.js" | sha256sum -c --quiet
mkdir -p "$dest"
cp "$tmp/package/plotly-basic.min.js" "$file.tmp" && mv "$file.tmp" "$file"
cp "$tmp/package/LICENSE" "$dest/plotly-basic-$version.LICENSE"
echo "fetched $file" >&2
