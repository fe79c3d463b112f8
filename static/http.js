// Talking to our own server from every page: the CSRF token, JSON requests, uploads with progress.
//
//   PicpeakHttp.csrfToken() -> the token of <meta name="csrf-token"> ("" when the page has none)
//   PicpeakHttp.json(url, {method, body, headers}) -> Promise<{ok, status, data, headers}>
//   PicpeakHttp.upload(url, formData, {onProgress(fraction)}) -> Promise<{ok, status, data, headers}>
//   PicpeakHttp.t("Saved %(name)s", {name}) -> the message in the page's language, placeholders filled
//   PicpeakHttp.nt("%(num)d photo", "%(num)d photos", n, {...}) -> the plural form for n (num is n)
//
// The translations come from the page itself: <script type="application/json" id="i18n"> (rendered by the server
// for the scripts the page loads, picpeak_lite/web/locale.py), read once. Each script calls them as _() and
// ngettext() so that `pybabel extract` finds its strings (babel.cfg). A message missing there is shown in
// English, the source language.
//
// Why one module: the token lookup, same-origin credentials and "Accept: application/json" (which makes the
// server answer errors as {"error": ...} instead of an HTML page) were written out by every page's script.
// Neither helper throws for an HTTP error status: the caller reads `status` and `data.error`. A network
// failure is status 0 with data {}. `data` is the parsed JSON body, or {} when the body is not JSON.
// Uploads use XMLHttpRequest because fetch() reports no upload progress. No build step, no dependencies.
"use strict";

(() => {
  const csrfToken = () => (document.querySelector('meta[name="csrf-token"]') || {}).content || "";

  const parse = (text) => {
    try {
      const data = JSON.parse(text);
      return data && typeof data === "object" ? data : {};
    } catch {
      return {};
    }
  };

  const json = async (url, { method = "GET", body, headers = {} } = {}) => {
    const init = { method, credentials: "same-origin", headers: { Accept: "application/json", ...headers } };
    if (method !== "GET" && method !== "HEAD") init.headers["X-CSRF-Token"] = csrfToken();
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(url, init);
    } catch {
      return { ok: false, status: 0, data: {}, headers: new Headers() };
    }
    const data = parse(await response.text().catch(() => ""));
    return { ok: response.ok, status: response.status, data, headers: response.headers };
  };

  const upload = (url, form, { onProgress } = {}) => new Promise((resolve) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", url);
    xhr.setRequestHeader("X-CSRF-Token", csrfToken());
    xhr.setRequestHeader("Accept", "application/json");
    if (onProgress) {
      xhr.upload.onprogress = (event) => { if (event.lengthComputable) onProgress(event.loaded / event.total); };
    }
    const headers = { get: (name) => xhr.getResponseHeader(name) };
    xhr.onload = () => resolve({ ok: xhr.status >= 200 && xhr.status < 300, status: xhr.status,
                                 data: parse(xhr.responseText), headers });
    xhr.onerror = xhr.ontimeout = xhr.onabort = () => resolve({ ok: false, status: 0, data: {}, headers });
    xhr.send(form);
  });

  let catalog = null;
  const loadCatalog = () => {
    if (catalog) return catalog;
    const block = document.getElementById("i18n");
    let data = {};
    try { data = block ? JSON.parse(block.textContent) : {}; } catch { data = {}; }
    let rules = null;
    try { rules = new Intl.PluralRules(data.lang || document.documentElement.lang || "en"); } catch { rules = null; }
    catalog = { strings: data.strings || {}, plural: data.plural || {}, rules };
    return catalog;
  };
  const fill = (text, values) => text.replace(/%\((\w+)\)[sd]|%%/g, (whole, name) => {
    if (whole === "%%") return "%";
    return values && Object.prototype.hasOwnProperty.call(values, name) ? String(values[name]) : whole;
  });
  const t = (message, values) => {
    const found = loadCatalog().strings[message];
    return fill(typeof found === "string" && found ? found : message, values);
  };
  const nt = (singular, plural, n, values) => {
    const { strings, plural: categories, rules } = loadCatalog();
    const forms = strings[singular];
    let text = n === 1 ? singular : plural;
    if (Array.isArray(forms) && forms.length && rules) {
      const index = categories[rules.select(n)];
      if (index !== undefined && forms[index]) text = forms[index];
    }
    return fill(text, { num: n, ...values });
  };

  window.PicpeakHttp = { csrfToken, json, upload, t, nt };
})();
