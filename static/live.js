// Live progress from the server, shared by every page that shows photos changing (see docs/live.md).
//
//   PicpeakLive.watchUpload({wsPath, statusUrl, onSnapshot, onPhoto, onDone}) -> {close()}
//   PicpeakLive.watchGallery({wsPath, onPhoto, onFeedback, onResync, onSnapshot, persistent}) -> {close()}
//     onFeedback(msg): a photo's likes, ratings or comments changed (its counts; the admin's also the newest comment)
//     persistent: never give up (a wall in the hall reconnects for as long as it runs, however long the server
//     or the Wi-Fi was away); onSnapshot(msg): a fresh snapshot arrived (first connect, or resume impossible);
//     onDisconnect(code): the connection dropped (a reconnect follows)
//
// Reconnects with backoff and resumes with ?since=<seq>, so nothing is missed; falls back to polling the
// status endpoint when WebSockets are unavailable (or keep failing). No build step; needs http.js before it.
"use strict";

(function () {
  const _ = window.PicpeakHttp.t;
  const MAX_BACKOFF_MS = 15000;
  const POLL_MS = 2000;
  const FAILURES_BEFORE_POLLING = 4;

  function wsUrl(path, since) {
    const url = new URL(path, window.location.href);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    if (since !== null) url.searchParams.set("since", String(since));
    return url.toString();
  }

  // One resumable connection. handlers.onMessage(msg) gets every message but pings; returns true to finish.
  function connect(path, handlers) {
    let since = null;
    let closed = false;
    let failures = 0;
    let socket = null;
    let timer = null;

    function schedule(fn, ms) {
      clearTimeout(timer);
      timer = setTimeout(fn, ms);
    }

    function open() {
      if (closed) return;
      if (!handlers.persistent && (!("WebSocket" in window) || failures >= FAILURES_BEFORE_POLLING)) {
        if (handlers.onFallback) { handlers.onFallback(); return; }
      }
      let opened = false;
      try {
        socket = new WebSocket(wsUrl(path, since));
      } catch (error) {
        failures += 1;
        schedule(open, backoff());
        return;
      }
      socket.onopen = () => { opened = true; failures = 0; };
      socket.onmessage = (event) => {
        let msg;
        try { msg = JSON.parse(event.data); } catch (error) { return; }
        if (typeof msg.seq === "number") since = msg.seq;
        if (msg.type === "ping") return;
        if (handlers.onMessage(msg)) finish();
      };
      socket.onclose = (event) => {
        socket = null;
        if (closed) return;
        if (handlers.onDisconnect) handlers.onDisconnect(event.code);
        if (event.code === 1000 || event.code === 4404) { finish(); return; }
        if (!opened) failures += 1;
        // 1001 "going away": the server is stopping (a restart); reconnect later, from a second or two on, and
        // resume with ?since= as after any drop. It is no failure of WebSockets (no step towards polling).
        if (event.code === 1001) { schedule(open, 1000 + Math.random() * 1000); return; }
        schedule(open, backoff());
      };
    }

    function backoff() {
      const base = Math.min(MAX_BACKOFF_MS, 500 * 2 ** Math.min(failures, 5));
      return base / 2 + Math.random() * base / 2;
    }

    function finish() {
      closed = true;
      clearTimeout(timer);
      if (socket) socket.close(1000);
    }

    open();
    return { close: finish };
  }

  function watchUpload(options) {
    let polling = null;
    const conn = connect(options.wsPath, {
      onMessage(msg) {
        if (msg.type === "snapshot") { options.onSnapshot && options.onSnapshot(msg); return false; }
        if (msg.type === "photo") { options.onPhoto && options.onPhoto(msg); return false; }
        if (msg.type === "done") { options.onDone && options.onDone(msg); return true; }
        if (msg.type === "error") { options.onError && options.onError(msg.error); return true; }
        return false;  // resync: a snapshot follows
      },
      onFallback() { polling = pollStatus(options); },
    });
    return { close() { conn.close(); if (polling) polling.close(); } };
  }

  // Without WebSockets: reload the status endpoint until the upload is done.
  function pollStatus(options) {
    let stopped = false;
    async function tick() {
      if (stopped) return;
      const answer = await window.PicpeakHttp.json(options.statusUrl);  // status 0 when offline: try again
      if (answer.ok) {
        options.onSnapshot && options.onSnapshot(answer.data);
        if (answer.data.done) { options.onDone && options.onDone(answer.data); return; }
      } else if ([401, 403, 404, 410].includes(answer.status)) {
        // Gone for good (unknown upload, gallery unpublished or expired, session ended): stop, say why.
        options.onError && options.onError(answer.data.error || (answer.status === 404 ? _("This upload is unknown.")
                                                                  : _("This gallery is no longer available.")));
        return;
      }
      setTimeout(tick, POLL_MS);
    }
    tick();
    return { close() { stopped = true; } };
  }

  function watchGallery(options) {
    return connect(options.wsPath, {
      persistent: Boolean(options.persistent),
      onDisconnect: options.onDisconnect,
      onMessage(msg) {
        if (msg.type === "snapshot") options.onSnapshot && options.onSnapshot(msg);
        if (msg.type === "photo") options.onPhoto && options.onPhoto(msg);
        if (msg.type === "feedback") options.onFeedback && options.onFeedback(msg);
        if (msg.type === "resync") options.onResync && options.onResync();
        return false;
      },
      onFallback() { /* the page still works; new photos show on the next reload */ },
    });
  }

  window.PicpeakLive = { watchUpload, watchGallery };
})();
