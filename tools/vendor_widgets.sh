#!/usr/bin/env bash
# Refresh the JavaScript the book needs to render offline, into book/static/vendor/.
#
#   tools/vendor_widgets.sh
#
# Why: myst-nb and Sphinx load require.js, the ipywidgets embed manager and MathJax
# from CDNs by default, so a book opened from disk without a network shows blank
# widgets and raw TeX. We pin the packages here, install them with npm into a
# scratch folder, and copy only the files a page actually fetches:
#   widgets/require.js        requirejs (AMD loader that embed-amd.js expects)
#   widgets/embed-amd.js      @jupyter-widgets/html-manager's embed bundle
#   widgets/*.woff2           the Font Awesome faces its CSS points at (Chrome uses woff2)
#   mathjax/tex-chtml.js      MathJax 3 TeX -> CommonHTML bundle
#   mathjax/output/chtml/fonts/woff-v2/*   its fonts (loaded relative to the script)
#   mathjax/input/tex/extensions/*.js      TeX packages MathJax autoloads on first use
#                                          (\boldsymbol, \cancel, \color, ...)
# The folder is deliberately not called `_static`: Jupyter Book would then inject
# every .js/.css inside it into every page.
set -euo pipefail

HTML_MANAGER_VERSION=1.0.15
REQUIREJS_VERSION=2.3.8
MATHJAX_VERSION=3.2.2

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$ROOT/book/static/vendor"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

cd "$WORK"
npm init -y >/dev/null
npm install --silent --no-audit --no-fund --ignore-scripts \
  "@jupyter-widgets/html-manager@$HTML_MANAGER_VERSION" \
  "requirejs@$REQUIREJS_VERSION" \
  "mathjax@$MATHJAX_VERSION"

rm -rf "$DEST/widgets" "$DEST/mathjax"
mkdir -p "$DEST/widgets" "$DEST/mathjax/output/chtml/fonts"

HM=node_modules/@jupyter-widgets/html-manager/dist
cp node_modules/requirejs/require.js "$DEST/widgets/require.js"
cp "$HM/embed-amd.js" "$DEST/widgets/embed-amd.js"
cp "$HM"/*.woff2 "$DEST/widgets/"

MJ=node_modules/mathjax/es5
cp "$MJ/tex-chtml.js" "$DEST/mathjax/tex-chtml.js"
cp -r "$MJ/output/chtml/fonts/woff-v2" "$DEST/mathjax/output/chtml/fonts/woff-v2"
mkdir -p "$DEST/mathjax/input/tex/extensions"
cp "$MJ"/input/tex/extensions/*.js "$DEST/mathjax/input/tex/extensions/"
rm "$DEST/mathjax/input/tex/extensions/all-packages.js"  # a bundle of all of them; never autoloaded

cat > "$DEST/VERSIONS.txt" <<TXT
Vendored by tools/vendor_widgets.sh; do not edit by hand.
@jupyter-widgets/html-manager $HTML_MANAGER_VERSION (BSD-3-Clause): widgets/embed-amd.js, widgets/*.woff2 (Font Awesome, SIL OFL 1.1)
requirejs $REQUIREJS_VERSION (MIT): widgets/require.js
mathjax $MATHJAX_VERSION (Apache-2.0): mathjax/tex-chtml.js, mathjax/output/chtml/fonts/woff-v2/, mathjax/input/tex/extensions/
TXT
du -sh "$DEST"
