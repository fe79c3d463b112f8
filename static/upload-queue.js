// The upload queue shared by the admin bulk uploader and the guest upload page (each is thin page glue).
//
//   const queue = PicpeakUploadQueue.create({
//     url,                      // the upload endpoint (multipart, field "photos")
//     tus: {url, chunkBytes},   // optional: send each file as a resumable tus upload instead (see below)
//     batchFiles: 1,            // files per request (the server's per-request limit is the upper bound)
//     batchBytes: Infinity,     // bytes per request (a batch always takes at least one file)
//     parallel: 3,              // requests in flight at once
//     maxFileBytes: 0,          // refuse larger files before sending (0: the server decides)
//     fields: () => ({}),       // extra form fields sent with every request
//     follow: (uploadId) => ({wsPath, statusUrl}),   // how to watch an accepted upload (PicpeakLive)
//     retryUrl: (photoId) => url | null,             // re-process a failed photo (admin only)
//     onUpdate: (changedItems, summary) => {},       // at most once per animation frame
//     onLost: (uploadId, reason) => {},              // an upload can no longer be followed
//   });
//   queue.add(files); queue.retry(item); queue.retryAll(); queue.clearFinished(); queue.busy()
//   await PicpeakUploadQueue.unfinished(tusUrl)   // [{name, size, sent}]: uploads an earlier visit left unfinished
//
// Every file is an item whose `state` is what is really happening to that photo, so a row can show it:
//   queued -> sending (item.sent, 0..1) -> pending -> processing -> complete | failed (item.error)
//   waiting   the server asked to slow down (429); sent again by itself after its Retry-After
//   duplicate the gallery already has these bytes
//   refused   the server (or the size limit) will never take this file: no retry, item.error says why
//   unsent    the request did not get through (network, 5xx, session ended): retry sends it again
//   lost      accepted, but its progress can no longer be followed (gallery gone, session ended)
// The summary's `finished` counts files that reached an end state; `processed` counts the photos among them that
// the server took and is done with, out of `photos` (every file but the refused ones): the admin's bar uses
// those (processed photos, not bytes sent, which reach 100 % long before the last photo is ready).
//
// With `tus`, each file goes up as a tus 1.0.0 upload in pieces of chunkBytes (small enough for any proxy's body
// limit), the files of one batch sharing an upload group (`upload_group` metadata). Each file's upload URL is
// kept in localStorage under a fingerprint (name, size, lastModified): choosing the same file again after a
// reload asks the server where it got to (HEAD) and goes on from there. A dropped connection is retried with
// backoff from the offset the server reports; while the browser is offline the file waits ("paused") and goes
// on by itself when it is back online. item.sent counts bytes the server has acknowledged plus those in flight.
// An upload the server no longer has (404 or 410: it expired after tus_idle_minutes without a byte, say a phone
// that slept) is started again from the first byte, at most MAX_RESTARTS times per file. A complete upload
// whose photo is not made yet (the last PATCH answers 503, HEAD 423, both with Retry-After) is asked again
// when the server says, the row showing the server's sentence; a refusal's sentence is shown as it is told.
//
// Following an accepted upload is PicpeakLive.watchUpload's job (WebSocket, with its own polling fallback):
// this module never polls. It needs http.js and live.js loaded before it.
"use strict";

(() => {
  const _ = window.PicpeakHttp.t;
  const ngettext = window.PicpeakHttp.nt;
  const RETRYABLE = new Set(["unsent"]);
  const SENDING = new Set(["queued", "waiting", "sending"]);
  const FOLLOWING = new Set(["pending", "processing"]);
  const FINISHED = new Set(["complete", "failed", "duplicate", "refused", "unsent", "lost"]);
  // A photo the server took and is done with (a refused file is no photo; an unsent one is still to send).
  const PROCESSED = new Set(["complete", "failed", "duplicate", "lost"]);

  // Why a whole request failed, for the files of it the answer did not name.
  const requestFailure = (status, data) => {
    if (status === 0) {
      return { state: "unsent", error: _("The transfer was interrupted. Check your connection and retry.") };
    }
    if (status === 401) {
      return { state: "unsent", error: data.error || _("Your session has ended; log in again, then retry.") };
    }
    if (status >= 500 || status === 423) {  // 423: every byte arrived, the server is still storing the photo
      return { state: "unsent", error: data.error || _("The server could not take this photo right now. Please retry.") };
    }
    return { state: "refused", error: data.error || _("The server refused this file (error %(status)s).", { status }) };
  };

  // --- tus: the resumable protocol (the server side is web/views/tus.py) --------------------------------------
  const TUS_STORE = "picpeak-tus:";
  const MAX_FAILURES = 10;  // in a row, while online; then the file is "unsent" and Retry resumes it
  const MAX_RESTARTS = 3;  // an upload the server lost (expired) is created afresh at most this often per file
  const MAX_LATER_S = 30;  // the longest wait between asks when the server says "later" (Retry-After)
  const live = new Set();   // XHRs in flight: aborted when the browser goes offline, so they fail at once

  window.addEventListener("offline", () => { for (const xhr of live) xhr.abort(); });

  const store = {
    get: (key) => { try { return localStorage.getItem(key); } catch { return null; } },
    set: (key, value) => { try { localStorage.setItem(key, value); } catch { /* private mode: no resuming */ } },
    remove: (key) => { try { localStorage.removeItem(key); } catch { /* nothing kept */ } },
  };

  const fingerprint = (tusUrl, file) => `${TUS_STORE}${tusUrl}|${file.name}|${file.size}|${file.lastModified}`;

  const base64 = (text) => btoa(Array.from(new TextEncoder().encode(text), (b) => String.fromCharCode(b)).join(""));

  const encodeMetadata = (values) => Object.entries(values)
    .filter(([, value]) => value !== undefined && value !== null && value !== "")
    .map(([key, value]) => `${key} ${base64(String(value))}`).join(",");

  const randomKey = () => Array.from(crypto.getRandomValues(new Uint8Array(16)),
                                     (b) => b.toString(16).padStart(2, "0")).join("");

  const parseJson = (text) => {
    try {
      const data = JSON.parse(text);
      return data && typeof data === "object" ? data : {};
    } catch {
      return {};
    }
  };

  // One tus request. XMLHttpRequest because fetch() reports no upload progress. Never throws: status 0 is a
  // network failure (or an abort because the browser went offline).
  const tusRequest = (method, url, { headers = {}, body = null, onProgress } = {}) => new Promise((resolve) => {
    const xhr = new XMLHttpRequest();
    xhr.open(method, url);
    const all = { "Tus-Resumable": "1.0.0", Accept: "application/json",
                  "X-CSRF-Token": window.PicpeakHttp.csrfToken(), ...headers };
    for (const [name, value] of Object.entries(all)) xhr.setRequestHeader(name, value);
    if (onProgress && body) xhr.upload.onprogress = (event) => onProgress(event.loaded);
    const done = (status) => {
      live.delete(xhr);
      resolve({ status, headers: { get: (name) => (status ? xhr.getResponseHeader(name) : null) },
                data: status ? parseJson(xhr.responseText) : {} });
    };
    xhr.onload = () => done(xhr.status);
    xhr.onerror = xhr.ontimeout = xhr.onabort = () => done(0);
    live.add(xhr);
    xhr.send(body);
  });

  const onceOnline = () => new Promise((resolve) => window.addEventListener("online", resolve, { once: true }));
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  // A failure worth trying again: the network, the server busy or restarting, an offset the server moved.
  const transient = (answer) => answer.status === 0 || answer.status === 423
    || (answer.status >= 500 && answer.status !== 507)
    || (answer.status === 409 && answer.headers.get("Upload-Offset") !== null);
  // The server's own "ask again in N s" (Retry-After in seconds): 423 to HEAD while a complete upload's photo
  // is not made yet, 503 to the PATCH whose try at making it failed. Nothing is wrong with the connection.
  const askLater = (answer) => {
    if (answer.status !== 423 && answer.status !== 503) return 0;
    const seconds = Number(answer.headers.get("Retry-After"));
    return Number.isFinite(seconds) && seconds > 0 ? Math.min(MAX_LATER_S, seconds) : 0;
  };
  // The server's sentence: a body's {"error"}, or for a HEAD (no body) the percent-encoded Picpeak-Error.
  const told = (answer) => {
    if (answer.data && answer.data.error) return answer.data.error;
    const header = answer.headers.get("Picpeak-Error");
    if (!header) return null;
    try { return decodeURIComponent(header); } catch { return header; }
  };

  const create = (options) => {
    const opts = { batchFiles: 1, batchBytes: Infinity, parallel: 3, maxFileBytes: 0, fields: () => ({}),
                   retryUrl: () => null, onUpdate: () => {}, onLost: () => {}, ...options };
    const items = [];
    const queue = [];
    const byPhotoId = new Map();
    const watches = new Map();  // upload_id -> {close()}
    const changed = new Set();
    let active = 0;
    let frame = 0;
    let resumeAt = 0;  // Date.now() before which nothing is sent (the server said 429)
    let resumeTimer = 0;

    const touch = (item, patch) => {
      Object.assign(item, patch);
      changed.add(item);
      if (!frame) frame = requestAnimationFrame(flush);
    };

    const flush = () => {
      frame = 0;
      const batch = [...changed];
      changed.clear();
      opts.onUpdate(batch, summary());
    };

    const summary = () => {
      const s = { total: 0, queued: 0, sending: 0, sent: 0, processing: 0, complete: 0, failed: 0, refused: 0,
                  unsent: 0, duplicates: 0, finished: 0, photos: 0, processed: 0, retryable: 0, clearable: 0,
                  active };
      for (const item of items) {
        if (item.cleared) continue;
        s.total += 1;
        if (item.state === "sending") s.sending += 1;
        else if (SENDING.has(item.state)) s.queued += 1;
        else if (item.state !== "refused" && item.state !== "unsent") s.sent += 1;
        if (FOLLOWING.has(item.state)) s.processing += 1;
        if (item.state === "complete") s.complete += 1;
        if (item.state === "failed" || item.state === "lost") s.failed += 1;
        if (item.state === "refused") s.refused += 1;
        if (item.state === "unsent") s.unsent += 1;
        if (item.state === "duplicate") s.duplicates += 1;
        if (FINISHED.has(item.state)) s.finished += 1;
        if (item.state !== "refused") s.photos += 1;
        if (PROCESSED.has(item.state)) s.processed += 1;
        if (canRetry(item)) s.retryable += 1;
        if (item.state === "complete" || item.state === "duplicate") s.clearable += 1;
      }
      s.busy = active > 0 || queue.length > 0;
      return s;
    };

    const canRetry = (item) => RETRYABLE.has(item.state)
      || (item.state === "failed" && Boolean(opts.retryUrl(item.photoId)));

    // --- sending ------------------------------------------------------------------------------------------
    const add = (files) => {
      for (const file of files) {
        const item = { index: items.length, file, name: file.name, size: file.size, sent: 0, state: "queued",
                       error: null, photoId: null, uploadId: null, photo: null, retries: 0 };
        items.push(item);
        if (opts.maxFileBytes && file.size > opts.maxFileBytes) {
          const mb = Math.round(opts.maxFileBytes / (1024 * 1024));
          touch(item, { state: "refused", error: _("Too large: the limit is %(num)s MB per photo.", { num: mb }) });
          continue;
        }
        queue.push(item);
        touch(item, {});
      }
      pump();
      // Draw the new rows now, not on the next frame: the page answers the choice at once.
      cancelAnimationFrame(frame);
      flush();
    };

    const pump = () => {
      const wait = resumeAt - Date.now();
      if (wait > 0) {
        clearTimeout(resumeTimer);
        resumeTimer = setTimeout(pump, wait);
        return;
      }
      while (active < opts.parallel && queue.length) {
        const batch = [];
        let bytes = 0;
        while (queue.length && batch.length < opts.batchFiles &&
               (batch.length === 0 || bytes + queue[0].size <= opts.batchBytes)) {
          const item = queue.shift();
          bytes += item.size;
          batch.push(item);
        }
        send(batch);
      }
    };

    const send = async (batch) => (opts.tus ? sendTus(batch) : sendMultipart(batch));

    const sendMultipart = async (batch) => {
      active += 1;
      const form = new FormData();
      for (const [name, value] of Object.entries(opts.fields())) if (value) form.append(name, value);
      for (const item of batch) {
        touch(item, { state: "sending", sent: 0, error: null });
        form.append("photos", item.file, item.name);
      }
      const onProgress = (share) => { for (const item of batch) touch(item, { sent: share }); };
      const answer = await window.PicpeakHttp.upload(opts.url, form, { onProgress });
      active -= 1;
      if (answer.status === 202) accepted(batch, answer.data);
      else if (answer.status === 429) slowDown(batch, Number(answer.headers.get("Retry-After")) || 10);
      else refused(batch, answer.status, answer.data);
      pump();
      if (!frame) frame = requestAnimationFrame(flush);
    };

    // --- sending with tus ----------------------------------------------------------------------------------
    // The files of a batch go up one after the other: each stays "queued" until its own bytes are sent (with
    // three batches in flight, three files are "sending", however long the queue).
    const sendTus = async (batch) => {
      active += 1;
      for (const item of batch) touch(item, { state: "queued", sent: 0, error: null });
      // Every file's upload is created (or found again) first: the files of the batch then share one group.
      const group = randomKey();
      const ready = [];
      for (const item of batch) if (await tusPrepare(item, group)) ready.push(item);
      for (const item of ready) {
        if (item.state !== "queued") continue;  // settled meanwhile (refused, slowed down, already complete)
        touch(item, { state: "sending", error: null });
        await tusTransfer(item, group);
      }
      active -= 1;
      pump();
      if (!frame) frame = requestAnimationFrame(flush);
    };

    // Waits out the browser being offline, the server's Retry-After (saying what the server says), or the
    // backoff after the failure-th failure in a row.
    const pause = async (item, failures, answer) => {
      const later = answer ? askLater(answer) : 0;
      if (!navigator.onLine) {
        touch(item, { paused: true, error: _("Offline: the upload goes on by itself when the connection is back.") });
        await onceOnline();
      } else if (later) {
        touch(item, { paused: true,
                      error: told(answer) || _("The server is busy; asking again in %(num)s s…", { num: Math.ceil(later) }) });
        await sleep(later * 1000);
      } else {
        const seconds = Math.min(30, 2 ** (failures - 1));
        touch(item, { paused: true, error: _("Connection lost; trying again in %(num)s s…", { num: seconds }) });
        await sleep(seconds * 1000);
      }
      touch(item, { paused: false, error: null });
    };

    // A request that is retried while the failure is transient. Offline waits do not count as failures, nor do
    // 423s: the photo of a complete upload is not made yet, and the server bounds its own tries at that
    // (tus_finish_attempts, then 410 and the file is sent again).
    const persist = async (item, request) => {
      let failures = 0;
      for (;;) {
        const answer = await request();
        if (!transient(answer) || answer.status === 409) return answer;
        if (navigator.onLine && !(answer.status === 423 && askLater(answer))) failures += 1;
        if (failures >= MAX_FAILURES) return answer;
        await pause(item, failures, answer);
      }
    };

    // Finds the file's earlier upload (by its fingerprint) or creates one. False when the file is settled.
    const tusPrepare = async (item, group) => {
      item.tusKey = fingerprint(opts.tus.url, item.file);
      const known = store.get(item.tusKey);
      if (known) {
        const head = await persist(item, () => tusRequest("HEAD", known));
        if (head.status === 200) {
          item.tusUrl = known;
          item.offset = Number(head.headers.get("Upload-Offset")) || 0;
          touch(item, { sent: item.offset / item.size, resumed: item.offset > 0 });
          if (head.headers.get("Picpeak-Photo-Id")) { tusFinished(item, head); return false; }
          return true;
        }
        if (head.status !== 404 && head.status !== 410) { tusFailed(item, head); return false; }
        store.remove(item.tusKey);  // expired or unknown: start again
      }
      const metadata = { ...opts.fields(), filename: item.name, filetype: item.file.type, upload_group: group };
      const answer = await persist(item, () => tusRequest("POST", opts.tus.url, {
        headers: { "Upload-Length": String(item.size), "Upload-Metadata": encodeMetadata(metadata) } }));
      if (answer.status !== 201 || !answer.headers.get("Location")) { tusFailed(item, answer); return false; }
      item.tusUrl = answer.headers.get("Location");
      item.offset = 0;
      store.set(item.tusKey, item.tusUrl);
      return true;
    };

    // The upload is gone on the server (expired or unknown): forget it and create it afresh. False when it may not
    // (the file is then "unsent": the person's Retry sends it again, with MAX_RESTARTS more fresh starts).
    const tusRestart = async (item, group) => {
      store.remove(item.tusKey);
      item.restarts = (item.restarts || 0) + 1;
      if (item.restarts > MAX_RESTARTS) {
        touch(item, { state: "unsent", paused: false, error: _("The server lost this upload again after %(num)s fresh starts. Retry to send it again.",
                                                      { num: MAX_RESTARTS }) });
        return false;
      }
      touch(item, { sent: 0, resumed: false, paused: false, error: null });
      return tusPrepare(item, group);
    };

    const tusTransfer = async (item, group) => {
      let failures = 0;
      for (;;) {
        const start = item.offset;
        const end = Math.min(item.size, start + opts.tus.chunkBytes);
        const answer = await tusRequest("PATCH", item.tusUrl, {
          headers: { "Upload-Offset": String(start), "Content-Type": "application/offset+octet-stream" },
          body: item.file.slice(start, end),
          onProgress: (loaded) => touch(item, { sent: Math.min(1, (start + loaded) / item.size) }),
        });
        if (answer.status === 204) {
          failures = 0;
          item.offset = Number(answer.headers.get("Upload-Offset")) || end;
          touch(item, { sent: item.offset / item.size });
          if (answer.headers.get("Picpeak-Photo-Id")) { tusFinished(item, answer); return; }
          continue;
        }
        if (!transient(answer)) {
          if (answer.status === 404 || answer.status === 410) {
            if (await tusRestart(item, group)) continue;
            if (item.state !== "sending") return;  // the new upload was refused (tusPrepare said why)
          }
          tusFailed(item, answer);
          return;
        }
        // 423 with Retry-After: another server process is writing this upload (its lease runs out by itself).
        if (navigator.onLine && !(answer.status === 423 && askLater(answer))) failures += 1;
        if (failures >= MAX_FAILURES) { tusFailed(item, answer); return; }
        if (answer.status !== 409) await pause(item, failures, answer);
        // Where did the server get to? It keeps what arrived of a cut-off chunk.
        const head = await persist(item, () => tusRequest("HEAD", item.tusUrl));
        if (head.status !== 200) {
          if (head.status === 404 || head.status === 410) {
            if (await tusRestart(item, group)) { failures = 0; continue; }
            if (item.state !== "sending") return;
          }
          tusFailed(item, head);
          return;
        }
        item.offset = Number(head.headers.get("Upload-Offset")) || 0;
        if (head.headers.get("Picpeak-Photo-Id")) { tusFinished(item, head); return; }
      }
    };

    const tusFinished = (item, answer) => {
      store.remove(item.tusKey);
      const photoId = Number(answer.headers.get("Picpeak-Photo-Id"));
      const uploadId = answer.headers.get("Picpeak-Upload-Id");
      if (answer.headers.get("Picpeak-Duplicate") === "true") {
        touch(item, { sent: 1, photoId, state: "duplicate", error: null });
      } else {
        touch(item, { sent: 1, photoId, uploadId, state: "pending", error: null });
        byPhotoId.set(photoId, item);
        if (early.has(photoId)) applyPhoto(early.get(photoId));  // its feed got there before this answer
        if (uploadId) rewatch(uploadId);
      }
      document.dispatchEvent(new CustomEvent("picpeak:uploaded", {
        detail: { upload_id: uploadId, photo_ids: [photoId] } }));
    };

    const tusFailed = (item, answer) => {
      if (answer.status === 429) {
        slowDown([item], Number(answer.headers.get("Retry-After")) || 10);
        return;
      }
      if (answer.status >= 400 && answer.status < 500 && answer.status !== 401 && answer.status !== 423) {
        store.remove(item.tusKey);  // refused: sending the same file again starts afresh
      }
      touch(item, { ...requestFailure(answer.status, { error: told(answer) }), paused: false });
    };

    // Answers name files by their (cleaned) name: match on name and size, then size, then what is left.
    const matcher = (batch) => {
      const left = new Set(batch);
      return (filename, size) => {
        let found = null;
        for (const item of left) {
          if (item.name === filename && (size == null || item.size === size)) { found = item; break; }
        }
        if (!found && size != null) for (const item of left) if (item.size === size) { found = item; break; }
        if (!found) for (const item of left) { found = item; break; }
        if (found) left.delete(found);
        return found;
      };
    };

    const refuseNamed = (match, errors) => {
      for (const error of errors || []) {
        const item = match(error.filename, null);
        if (item) touch(item, { state: "refused", error: error.error });
      }
    };

    const accepted = (batch, data) => {
      const match = matcher(batch);
      for (const photo of data.photos || []) {
        const item = match(photo.filename, photo.size);
        if (!item) continue;
        if (photo.duplicate) {
          touch(item, { sent: 1, photoId: photo.id, state: "duplicate" });
        } else {
          touch(item, { sent: 1, photoId: photo.id, uploadId: data.upload_id, state: "pending" });
          byPhotoId.set(photo.id, item);
        }
      }
      refuseNamed(match, data.errors);
      for (const item of batch) {
        if (item.state === "sending") touch(item, { state: "refused", error: _("The server did not list this file.") });
      }
      if (data.upload_id) watch(data.upload_id);
      document.dispatchEvent(new CustomEvent("picpeak:uploaded", { detail: data }));
    };

    const refused = (batch, status, data) => {
      const match = matcher(batch);
      if (status >= 400 && status < 500 && status !== 401) refuseNamed(match, data.errors);
      const failure = requestFailure(status, data);
      for (const item of batch) if (item.state === "sending") touch(item, { ...failure, sent: 0 });
    };

    const slowDown = (batch, seconds) => {
      resumeAt = Math.max(resumeAt, Date.now() + Math.max(1, seconds) * 1000);
      const error = seconds > 90
        ? ngettext("The server asked to slow down. Sending again in about %(num)d minute…",
                   "The server asked to slow down. Sending again in about %(num)d minutes…", Math.ceil(seconds / 60))
        : ngettext("The server asked to slow down. Sending again in %(num)d second…",
                   "The server asked to slow down. Sending again in %(num)d seconds…", seconds);
      for (const item of batch) {
        touch(item, { state: "waiting", sent: 0, error });
      }
      queue.unshift(...batch);
    };

    // --- following, through live.js -----------------------------------------------------------------------
    const early = new Map();  // photo id -> its latest change, for photos whose tus answer is still on its way
    const applyPhoto = (p) => {
      const item = byPhotoId.get(p.id);
      if (!item && p.id) { early.set(p.id, p); return; }
      if (!item || !p.status || p.status === "deleted" || item.state === "lost") return;
      if (item.state === p.status && item.state !== "failed") return;
      const error = p.status === "failed" ? (p.error || _("This photo could not be processed.")) : null;
      touch(item, { state: p.status, error, photo: { ...(item.photo || {}), ...p } });
    };

    const watch = (uploadId) => {
      if (watches.has(uploadId)) return;
      const { wsPath, statusUrl } = opts.follow(uploadId);
      let watcher = null;
      // Stops this watcher only: a newer one for the same upload (rewatch) may have taken its place meanwhile.
      const stop = () => {
        if (watches.get(uploadId) === watcher) watches.delete(uploadId);
        if (watcher) watcher.close();
      };
      watcher = window.PicpeakLive.watchUpload({
        wsPath, statusUrl,
        onSnapshot: (status) => (status.photos || []).forEach(applyPhoto),
        onPhoto: applyPhoto,
        onDone: (status) => { (status.photos || []).forEach(applyPhoto); setTimeout(stop, 0); },
        onError: (reason) => {
          setTimeout(stop, 0);
          lose(uploadId, reason || _("This upload can no longer be followed."));
        },
      });
      watches.set(uploadId, watcher);
    };

    // A tus batch's photos join their upload one by one, and the feed says "done" once the photos it knows of
    // are all finished: a photo that joins later is followed by a fresh watcher (its snapshot includes it).
    const rewatch = (uploadId) => {
      const old = watches.get(uploadId);
      watches.delete(uploadId);
      if (old) old.close();
      watch(uploadId);
    };

    const lose = (uploadId, reason) => {
      for (const item of items) {
        if (item.uploadId === uploadId && FOLLOWING.has(item.state)) {
          touch(item, { state: "lost", error: `Uploaded, but its progress can no longer be shown. ${reason}` });
        }
      }
      opts.onLost(uploadId, reason);
    };

    // --- retry and clearing -------------------------------------------------------------------------------
    const retry = async (item) => {
      if (RETRYABLE.has(item.state)) {
        queue.push(item);
        touch(item, { state: "queued", sent: 0, error: null, retries: item.retries + 1, restarts: 0 });
        pump();
        return;
      }
      const url = item.state === "failed" ? opts.retryUrl(item.photoId) : null;
      if (!url) return;
      touch(item, { state: "pending", error: null, retries: item.retries + 1 });
      const answer = await window.PicpeakHttp.json(url, { method: "POST" });
      if (!answer.ok) {
        touch(item, { state: "failed", error: answer.data.error || _("The retry was not accepted.") });
        return;
      }
      watch(item.uploadId);
    };

    const retryAll = () => items.filter((item) => !item.cleared && canRetry(item)).forEach(retry);

    const clearFinished = () => {
      for (const item of items) {
        if (!item.cleared && (item.state === "complete" || item.state === "duplicate")) touch(item, { cleared: true });
      }
    };

    return { add, retry, retryAll, clearFinished, canRetry, summary, items,
             busy: () => active > 0 || queue.length > 0 };
  };

  // The uploads this browser started to tusUrl and did not finish (their URLs are kept by fingerprint), as the
  // server sees them now: [{name, size, sent}] (sent 0..1). One the server no longer has (expired) is forgotten;
  // one the server could not be asked about (offline) is listed all the same. Choosing the file again resumes it.
  const unfinished = async (tusUrl) => {
    const prefix = `${TUS_STORE}${tusUrl}|`;
    const keys = [];
    try {
      for (let i = 0; i < localStorage.length; i += 1) {
        const key = localStorage.key(i);
        if (key && key.startsWith(prefix)) keys.push(key);
      }
    } catch { return []; }
    const found = [];
    for (const key of keys) {
      const parts = key.slice(prefix.length).split("|");
      parts.pop();  // lastModified
      const size = Number(parts.pop());
      const name = parts.join("|");
      const url = store.get(key);
      if (!url || !name || !size) continue;
      const head = await tusRequest("HEAD", url);
      if (head.status === 404 || head.status === 410 || head.headers.get("Picpeak-Photo-Id")) {
        store.remove(key);  // expired, or finished after all: nothing to resume
        continue;
      }
      const offset = Number(head.headers.get("Upload-Offset")) || 0;
      found.push({ key, name, size, sent: offset / size });
    }
    return found;
  };

  window.PicpeakUploadQueue = { create, unfinished };
})();
