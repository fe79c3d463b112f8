// The upload queue shared by the admin bulk uploader and the guest upload page (each is thin page glue).
//
//   const queue = PicpeakUploadQueue.create({
//     url,                      // the upload endpoint (multipart, field "photos")
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
//
// Every file is an item whose `state` is what is really happening to that photo, so a row can show it:
//   queued -> sending (item.sent, 0..1) -> pending -> processing -> complete | failed (item.error)
//   waiting   the server asked to slow down (429); sent again by itself after its Retry-After
//   duplicate the gallery already has these bytes
//   refused   the server (or the size limit) will never take this file: no retry, item.error says why
//   unsent    the request did not get through (network, 5xx, session ended): retry sends it again
//   lost      accepted, but its progress can no longer be followed (gallery gone, session ended)
// The summary's `finished` counts photos that reached an end state; the progress bars use it (processed
// photos, not bytes sent, which reach 100 % long before the last photo is ready).
//
// Following an accepted upload is PicpeakLive.watchUpload's job (WebSocket, with its own polling fallback):
// this module never polls. It needs http.js and live.js loaded before it.
"use strict";

(() => {
  const RETRYABLE = new Set(["unsent"]);
  const SENDING = new Set(["queued", "waiting", "sending"]);
  const FOLLOWING = new Set(["pending", "processing"]);
  const FINISHED = new Set(["complete", "failed", "duplicate", "refused", "unsent", "lost"]);

  // Why a whole request failed, for the files of it the answer did not name.
  const requestFailure = (status, data) => {
    if (status === 0) {
      return { state: "unsent", error: "The transfer was interrupted. Check your connection and retry." };
    }
    if (status === 401) {
      return { state: "unsent", error: data.error || "Your session has ended; log in again, then retry." };
    }
    if (status >= 500) {
      return { state: "unsent", error: data.error || "The server could not take this photo right now. Please retry." };
    }
    return { state: "refused", error: data.error || `The server refused this file (error ${status}).` };
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
                  unsent: 0, duplicates: 0, finished: 0, retryable: 0, clearable: 0, active };
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
          touch(item, { state: "refused", error: `Too large: the limit is ${mb} MB per photo.` });
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

    const send = async (batch) => {
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
        if (item.state === "sending") touch(item, { state: "refused", error: "The server did not list this file." });
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
      const wait = seconds > 90 ? `about ${Math.ceil(seconds / 60)} minutes` : `${seconds} seconds`;
      for (const item of batch) {
        touch(item, { state: "waiting", sent: 0, error: `The server asked to slow down. Sending again in ${wait}…` });
      }
      queue.unshift(...batch);
    };

    // --- following, through live.js -----------------------------------------------------------------------
    const applyPhoto = (p) => {
      const item = byPhotoId.get(p.id);
      if (!item || !p.status || p.status === "deleted" || item.state === "lost") return;
      if (item.state === p.status && item.state !== "failed") return;
      const error = p.status === "failed" ? (p.error || "This photo could not be processed.") : null;
      touch(item, { state: p.status, error, photo: { ...(item.photo || {}), ...p } });
    };

    const watch = (uploadId) => {
      if (watches.has(uploadId)) return;
      const { wsPath, statusUrl } = opts.follow(uploadId);
      const stop = () => { const w = watches.get(uploadId); watches.delete(uploadId); if (w) w.close(); };
      const watcher = window.PicpeakLive.watchUpload({
        wsPath, statusUrl,
        onSnapshot: (status) => (status.photos || []).forEach(applyPhoto),
        onPhoto: applyPhoto,
        onDone: (status) => { (status.photos || []).forEach(applyPhoto); setTimeout(stop, 0); },
        onError: (reason) => {
          setTimeout(stop, 0);
          lose(uploadId, reason || "This upload can no longer be followed.");
        },
      });
      watches.set(uploadId, watcher);
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
        touch(item, { state: "queued", sent: 0, error: null, retries: item.retries + 1 });
        pump();
        return;
      }
      const url = item.state === "failed" ? opts.retryUrl(item.photoId) : null;
      if (!url) return;
      touch(item, { state: "pending", error: null, retries: item.retries + 1 });
      const answer = await window.PicpeakHttp.json(url, { method: "POST" });
      if (!answer.ok) {
        touch(item, { state: "failed", error: answer.data.error || "The retry was not accepted." });
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

  window.PicpeakUploadQueue = { create };
})();
