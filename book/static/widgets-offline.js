/* servelab book: make the vendored ipywidgets embed manager work from disk.
 * Loaded after require.js and before embed-amd.js (see nb_ipywidgets_js in _config.yml).
 * Written by hand; the vendored files it serves sit in vendor/widgets/ beside it.
 *
 * 1. Fonts. embed-amd.js computes where its Font Awesome files live from an AMD module
 *    name ("@jupyter-widgets/html-manager/dist/...", "@jupyter-widgets/controls"), resolved
 *    against the page's folder: right on a CDN, wrong on disk. Point those names at the
 *    vendored folder instead.
 * 2. MathJax. ipywidgets typesets widget labels with the MathJax 2 call
 *    MathJax.Hub.Queue(["Typeset", MathJax.Hub, element]); the book loads MathJax 3, which
 *    has no Hub, so every labelled widget would throw. Give MathJax 3 a tiny Hub that
 *    forwards to typesetPromise, installed as soon as MathJax finishes starting up.
 */
(function () {
  "use strict";
  var script = document.currentScript;
  if (script && window.requirejs) {
    var folder = script.src.replace(/[?#].*$/, "").replace(/\/[^\/]*$/, "") + "/vendor/widgets";
    // Each bundled module (html-manager, base, controls, output) derives the font folder
    // from its own name, so map both name roots onto the vendored folder.
    window.requirejs.config({
      paths: { "@jupyter-widgets/html-manager/dist": folder, "@jupyter-widgets": folder },
    });
  }

  function installHub(mathjax) {
    if (!mathjax || mathjax.Hub) return;
    mathjax.Hub = {
      Queue: function (command) {
        var element = command && command[2];
        if (typeof mathjax.typesetPromise === "function") {
          mathjax.typesetPromise(element ? [element] : undefined).catch(function () {});
        }
      },
    };
  }

  var mathjax = window.MathJax;
  if (mathjax === undefined) return; // no math on this page: ipywidgets skips typesetting
  if (mathjax.version) {
    installHub(mathjax); // MathJax 3 already running
    return;
  }
  // window.MathJax is still the configuration object: hook MathJax 3's startup.
  mathjax.startup = mathjax.startup || {};
  var ready = mathjax.startup.ready;
  mathjax.startup.ready = function () {
    if (ready) ready();
    else window.MathJax.startup.defaultReady();
    installHub(window.MathJax);
  };
  // Until then, queue calls harmlessly on the config object's own Hub.
  mathjax.Hub = { Queue: function () {} };
})();
