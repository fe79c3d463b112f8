// The live wall (templates/wall.html): a full-screen slideshow of the gallery's visible photos.
//
// Starts from the wall's photo list, then follows the wall feed (live.js, persistent: it reconnects for as long
// as the page runs and resumes where it left off, after a server restart or a dropped Wi-Fi). A photo that
// becomes visible jumps the queue: it is shown as soon as its preview image is decoded, unless another new
// photo arrived just before it (each new photo stays at least FRESH_MIN_MS). Two layers cross-fade; only two
// <img> elements ever exist, the rotation is bounded, so memory stays flat over hours.
// Keys: space pauses, arrows step, f toggles full screen. The screen is kept awake (Wake Lock API).
// window.PicpeakWall.shown lists the last photos shown with when (for tests and bench/bench_wall.py).
"use strict";

(() => {
  const _ = window.PicpeakHttp.t;
  const body = document.getElementById("wall");
  if (!body) return;
  const layers = [document.getElementById("wall-a"), document.getElementById("wall-b")];
  const empty = document.getElementById("wall-empty");
  const stateEl = document.getElementById("wall-state");
  const DWELL_MS = 8000;
  const FRESH_MIN_MS = 2000;
  const MAX_ROTATION = 500;
  const HISTORY = 50;
  const LOG = 200;

  let rotation = [];          // {id, url, caption}: newest first
  const known = new Map();    // id -> photo, exactly those in rotation
  let fresh = [];             // ids of new photos, shown before the rotation goes on
  let cursor = 0;
  let front = 0;
  let current = null;
  let currentFresh = false;
  let shownAt = 0;
  let paused = false;
  let loading = false;
  let timer = 0;
  const history = [];
  const shown = [];
  window.PicpeakWall = { shown, current: () => (current ? current.id : null), paused: () => paused };

  function setState(text) {
    stateEl.textContent = text || "";
    stateEl.hidden = !text;
  }

  function schedule(ms) {
    clearTimeout(timer);
    if (!paused) timer = setTimeout(next, Math.max(0, ms));
  }

  function freshDelay() {
    return currentFresh ? FRESH_MIN_MS - (performance.now() - shownAt) : 0;
  }

  function pick() {
    while (fresh.length) {
      const photo = known.get(fresh.shift());
      if (photo) return { photo, isFresh: true };
    }
    if (!rotation.length) return null;
    if (cursor >= rotation.length) cursor = 0;
    return { photo: rotation[cursor++], isFresh: false };
  }

  function next() {
    if (loading) return;
    const choice = pick();
    if (!choice) {
      current = null;
      layers.forEach((layer) => layer.classList.remove("is-shown"));
      empty.hidden = false;
      return;
    }
    if (!choice.isFresh && current && choice.photo.id === current.id) { schedule(DWELL_MS); return; }
    show(choice.photo, choice.isFresh, true);
  }

  async function show(photo, isFresh, remember) {
    loading = true;
    const img = new Image();
    img.alt = "";
    img.src = photo.url;
    try {
      await img.decode();
    } catch (error) {
      loading = false;
      drop(photo.id);  // gone meanwhile, or not an image: the wall goes on without it
      schedule(250);
      return;
    }
    loading = false;
    if (!known.has(photo.id)) { schedule(0); return; }
    const layer = layers[1 - front];
    layer.querySelector("img").replaceWith(img);
    layer.querySelector("figcaption").textContent = photo.caption || "";
    layer.classList.add("is-shown");
    layers[front].classList.remove("is-shown");
    front = 1 - front;
    if (remember && current) {
      history.push(current.id);
      if (history.length > HISTORY) history.shift();
    }
    current = photo;
    currentFresh = isFresh;
    shownAt = performance.now();
    shown.push({ id: photo.id, at: performance.timeOrigin + shownAt, fresh: isFresh });
    if (shown.length > LOG) shown.shift();
    document.documentElement.dataset.showing = String(photo.id);
    empty.hidden = true;
    schedule(fresh.length ? freshDelay() : DWELL_MS);
  }

  function add(raw, isNew) {
    const photo = { id: raw.id, url: raw.view_url, caption: raw.caption || "" };
    if (known.has(photo.id)) {
      const had = known.get(photo.id);
      had.caption = photo.caption;
      // Complete again (a replaced photo's new version): shown from now on, past the browser's cache.
      if (isNew && raw.seq) had.url = photo.url + (photo.url.includes("?") ? "&" : "?") + "v=" + raw.seq;
      return;
    }
    known.set(photo.id, photo);
    if (isNew) {
      rotation.unshift(photo);
      cursor += 1;
      fresh.push(photo.id);
    } else {
      rotation.push(photo);
    }
    while (rotation.length > MAX_ROTATION) known.delete(rotation.pop().id);
    if (loading || paused) return;
    if (isNew) schedule(freshDelay());
    else if (!current) schedule(0);
  }

  function drop(id) {
    if (!known.has(id)) return;
    known.delete(id);
    const at = rotation.findIndex((p) => p.id === id);
    if (at >= 0) { rotation.splice(at, 1); if (at < cursor) cursor -= 1; }
    fresh = fresh.filter((f) => f !== id);
    if (current && current.id === id) schedule(0);
  }

  async function load() {
    const answer = await window.PicpeakHttp.json(body.dataset.photosUrl);
    if (!answer.ok) {
      // Refused (the gallery expired or was unpublished, or the link was replaced or removed while the wall
      // ran): the page is loaded again, so the screen answers as the gallery page does (the expired page with
      // the photographer's contact, ...) instead of "Reconnecting…" over the last photos for ever.
      if ([403, 404, 410].includes(answer.status)) window.location.reload();
      return;
    }
    const listed = new Set(answer.data.photos.map((p) => p.id));
    [...known.keys()].forEach((id) => { if (!listed.has(id)) drop(id); });
    answer.data.photos.forEach((p) => add(p, false));
    if (!current && !loading) schedule(0);
  }

  window.PicpeakLive.watchGallery({
    wsPath: body.dataset.wsPath,
    persistent: true,
    onSnapshot: () => { setState(null); load(); },
    onPhoto: (msg) => {
      setState(null);
      if (msg.status === "complete") add(msg, true);
      else if (msg.status === "removed") drop(msg.id);
    },
    onResync: () => load(),
    onDisconnect: (code) => {
      setState(_("Reconnecting…"));
      if (code === 4403) load();  // no longer allowed (expired, unpublished, the link replaced): say why
    },
  });
  load();

  // ---- keys ------------------------------------------------------------------------------------------------
  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.key === " " || event.key === "Spacebar") {
      event.preventDefault();
      paused = !paused;
      setState(paused ? _("Paused") : null);
      if (paused) clearTimeout(timer); else schedule(0);
    } else if (event.key === "ArrowRight" || event.key === "ArrowDown") {
      event.preventDefault();
      clearTimeout(timer);
      if (!loading) next();
    } else if (event.key === "ArrowLeft" || event.key === "ArrowUp") {
      event.preventDefault();
      const back = known.get(history.pop());
      if (back && !loading) { clearTimeout(timer); show(back, false, false); }
    } else if (event.key === "f") {
      if (document.fullscreenElement) document.exitFullscreen().catch(() => {});
      else document.documentElement.requestFullscreen().catch(() => {});
    }
  });
  document.addEventListener("dblclick", () => {
    if (!document.fullscreenElement) document.documentElement.requestFullscreen().catch(() => {});
  });

  // ---- a screen that never sleeps, a pointer that hides ------------------------------------------------------
  let lock = null;
  async function keepAwake() {
    if (lock || document.visibilityState !== "visible" || !("wakeLock" in navigator)) return;
    try {
      lock = await navigator.wakeLock.request("screen");
      lock.addEventListener("release", () => { lock = null; });
    } catch (error) {
      lock = null;  // refused (no user gesture yet, battery saver): try again on the next visibility change
    }
  }
  document.addEventListener("visibilitychange", keepAwake);
  document.addEventListener("click", keepAwake);
  keepAwake();
  let idle = 0;
  document.addEventListener("mousemove", () => {
    body.classList.remove("idle");
    clearTimeout(idle);
    idle = setTimeout(() => body.classList.add("idle"), 3000);
  });
})();
