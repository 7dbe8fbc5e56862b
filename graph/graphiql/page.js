// Starts GraphiQL on the API of the page's own origin. It lives in a file of its own,
// not inline, so that the page's Content-Security-Policy can allow scripts of this
// origin only. The API key goes in the Headers tab ({"Authorization": "Bearer bpk_…"}).
"use strict";

// GraphiQL's dialogs write a <style> element when they open; GraphiQL gives it the
// nonce found in __webpack_nonce__, which is this response's (see graphiql.CSP).
window.__webpack_nonce__ = document.currentScript.nonce;

(function () {
  const root = document.getElementById("graphiql");
  const endpoint = root.dataset.endpoint;
  const ws = location.protocol === "https:" ? "wss:" : "ws:";
  const fetcher = GraphiQL.createFetcher({
    url: location.protocol + "//" + location.host + endpoint,
    subscriptionUrl: ws + "//" + location.host + endpoint,
  });
  ReactDOM.createRoot(root).render(
    React.createElement(GraphiQL, {
      fetcher: fetcher,
      isHeadersEditorEnabled: true,
      // The headers hold the API key: they are never written to the browser's
      // storage, where any script of this origin, or the next user of the browser,
      // would read it. A person pastes the key once per page.
      shouldPersistHeaders: false,
      plugins: [],
      inputValueDeprecation: true,
    }),
  );
})();
