// The bulk uploader on the admin gallery page.
//
// Files (chosen, dropped, or whole folders) go up in batches of BATCH_FILES (and at most BATCH_BYTES) with
// PARALLEL requests at a time; each batch's XHR upload progress is spread over its files by size. Accepted
// photos are then followed per upload_id through PicpeakLive.watchUpload (WebSocket, or polling the status
// endpoint when live.js is missing). The DOM is touched once per animation frame, for the rows that changed,
// so hundreds of files never freeze the page.
"use strict";

(function () {
  const section = document.getElementById("upload");
  if (!section) return;

  const BATCH_FILES = 20;
  const BATCH_BYTES = 200 * 1024 * 1024;
  const PARALLEL = 3;
  const POLL_MS = 1500;
  const IMAGE_NAME = /\.(jpe?g|png|webp|heic|heif)$/i;
  const LABELS = {
    queued: "Queued", sending: "Sending", pending: "Waiting", processing: "Processing", complete: "Done",
    failed: "Failed", "transfer-failed": "Not sent", duplicate: "Already in the gallery",
  };

  const uploadUrl = section.dataset.uploadUrl;
  const list = document.getElementById("upload-list");
  const summary = document.getElementById("upload-summary");
  const els = {};
  for (const id of ["up-sent", "up-total", "up-done", "up-failed", "up-dupes", "up-processing", "up-progress",
                    "retry-all", "clear-finished"]) els[id] = document.getElementById(id);

  const items = [];
  const queue = [];
  const byPhotoId = new Map();
  const watches = new Map();  // upload_id -> {close()}
  const dirty = new Set();
  let active = 0;
  let frame = 0;

  const csrf = () => (document.querySelector('meta[name="csrf-token"]') || {}).content || "";

  // --- choosing files -------------------------------------------------------------------------------------
  for (const id of ["file-input", "folder-input"]) {
    const input = document.getElementById(id);
    input.addEventListener("change", () => { addFiles(Array.from(input.files)); input.value = ""; });
  }
  const zone = document.getElementById("dropzone");
  zone.addEventListener("dragover", (event) => { event.preventDefault(); zone.classList.add("over"); });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", async (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    const entries = Array.from(event.dataTransfer.items || [])
      .map((item) => (item.webkitGetAsEntry ? item.webkitGetAsEntry() : null)).filter(Boolean);
    if (entries.length) {
      const files = [];
      for (const entry of entries) await collect(entry, files);
      addFiles(files);
    } else {
      addFiles(Array.from(event.dataTransfer.files));
    }
  });

  // A dropped folder: walk it (readEntries answers in chunks, so call it until it returns nothing).
  async function collect(entry, out) {
    if (entry.isFile) {
      out.push(await new Promise((resolve, reject) => entry.file(resolve, reject)));
      return;
    }
    if (!entry.isDirectory) return;
    const reader = entry.createReader();
    for (;;) {
      const chunk = await new Promise((resolve, reject) => reader.readEntries(resolve, reject));
      if (!chunk.length) break;
      for (const child of chunk) await collect(child, out);
    }
  }

  function addFiles(files) {
    const images = files.filter((f) => f.type.startsWith("image/") || IMAGE_NAME.test(f.name));
    for (const file of images) {
      const item = { index: items.length, file, name: file.name, size: file.size, sent: 0, state: "queued",
                     error: null, photoId: null, uploadId: null, row: null };
      items.push(item);
      queue.push(item);
      dirty.add(item);
    }
    summary.hidden = items.length === 0;
    schedule();
    pump();
  }

  // --- sending ------------------------------------------------------------------------------------------
  function pump() {
    while (active < PARALLEL && queue.length) {
      const batch = [];
      let bytes = 0;
      while (queue.length && batch.length < BATCH_FILES && (batch.length === 0 || bytes + queue[0].size <= BATCH_BYTES)) {
        const item = queue.shift();
        bytes += item.size;
        batch.push(item);
      }
      send(batch);
    }
  }

  function send(batch) {
    active += 1;
    const form = new FormData();
    for (const item of batch) {
      item.state = "sending"; item.sent = 0; item.error = null; dirty.add(item);
      form.append("photos", item.file, item.name);
    }
    schedule();
    const xhr = new XMLHttpRequest();
    xhr.open("POST", uploadUrl);
    xhr.setRequestHeader("X-CSRF-Token", csrf());
    xhr.setRequestHeader("Accept", "application/json");
    xhr.upload.onprogress = (event) => {
      const share = event.lengthComputable ? event.loaded / event.total : 0;
      for (const item of batch) { item.sent = Math.min(item.size, share * item.size); dirty.add(item); }
      schedule();
    };
    xhr.onload = () => {
      let data = {};
      try { data = JSON.parse(xhr.responseText); } catch { /* not JSON: handled as a failure below */ }
      if (xhr.status === 202) accepted(batch, data);
      else refused(batch, data, xhr.status);
      finish();
    };
    xhr.onerror = xhr.onabort = () => { refused(batch, {}, 0); finish(); };
    xhr.send(form);

    function finish() {
      active -= 1;
      schedule();
      pump();
    }
  }

  // Answers name files by their (cleaned) name: match on name and size, then size, then what is left.
  function matcher(batch) {
    const left = new Set(batch);
    return (filename, size) => {
      let found = null;
      for (const item of left) if (item.name === filename && (size == null || item.size === size)) { found = item; break; }
      if (!found && size != null) for (const item of left) if (item.size === size) { found = item; break; }
      if (!found) for (const item of left) { found = item; break; }
      if (found) left.delete(found);
      return found;
    };
  }

  function accepted(batch, data) {
    const match = matcher(batch);
    let watched = false;
    for (const photo of data.photos || []) {
      const item = match(photo.filename, photo.size);
      if (!item) continue;
      item.sent = item.size;
      item.photoId = photo.id;
      if (photo.duplicate) {
        item.state = "duplicate";
      } else {
        item.state = "pending";
        item.uploadId = data.upload_id;
        byPhotoId.set(photo.id, item);
        watched = true;
      }
      dirty.add(item);
    }
    for (const error of data.errors || []) {
      const item = match(error.filename, null);
      if (item) { item.state = "transfer-failed"; item.error = error.error; dirty.add(item); }
    }
    for (const item of batch) {
      if (item.state === "sending") { item.state = "transfer-failed"; item.error = "The server did not list this file."; dirty.add(item); }
    }
    if (watched && data.upload_id) watch(data.upload_id);
    document.dispatchEvent(new CustomEvent("picpeak:uploaded", { detail: data }));
    schedule();
  }

  function refused(batch, data, status) {
    const match = matcher(batch);
    for (const error of data.errors || []) {
      const item = match(error.filename, null);
      if (item) { item.state = "transfer-failed"; item.error = error.error; dirty.add(item); }
    }
    const reason = status === 0 ? "Network error: the file was not sent."
      : status === 401 || status === 403 ? "Your session has ended; log in again, then retry."
      : data.error || `The server answered ${status}.`;
    for (const item of batch) {
      if (item.state === "sending") { item.state = "transfer-failed"; item.error = reason; dirty.add(item); }
    }
    schedule();
  }

  // --- processing status --------------------------------------------------------------------------------
  function watch(uploadId) {
    if (watches.has(uploadId)) return;
    const statusUrl = `/api/admin/uploads/${uploadId}`;
    const apply = (p) => {
      const item = byPhotoId.get(p.id);
      if (!item || !p.status || p.status === "deleted") return;
      item.state = p.status;
      item.error = p.error || null;
      dirty.add(item);
      schedule();
    };
    const done = async () => {
      // One last look at the database: the final word, whatever the feed delivered.
      try {
        const response = await fetch(statusUrl, { credentials: "same-origin", headers: { Accept: "application/json" } });
        if (response.ok) (await response.json()).photos.forEach(apply);
      } catch { /* the snapshot we have stays */ }
      const w = watches.get(uploadId);
      watches.delete(uploadId);
      if (w) w.close();
    };
    if (window.PicpeakLive && window.PicpeakLive.watchUpload) {
      watches.set(uploadId, window.PicpeakLive.watchUpload({
        wsPath: `/ws/uploads/${uploadId}`, statusUrl,
        onSnapshot: (status) => (status.photos || []).forEach(apply),
        onPhoto: apply,
        onDone: () => { setTimeout(done, 0); },
      }));
    } else {
      let stopped = false;
      const tick = async () => {
        if (stopped) return;
        try {
          const response = await fetch(statusUrl, { credentials: "same-origin", headers: { Accept: "application/json" } });
          if (response.ok) {
            const status = await response.json();
            status.photos.forEach(apply);
            if (status.done) { watches.delete(uploadId); return; }
          }
        } catch { /* try again */ }
        setTimeout(tick, POLL_MS);
      };
      watches.set(uploadId, { close() { stopped = true; } });
      tick();
    }
  }

  // --- retry --------------------------------------------------------------------------------------------
  async function retry(item) {
    if (item.state === "transfer-failed") {
      item.state = "queued"; item.sent = 0; item.error = null; dirty.add(item);
      queue.push(item);
      schedule();
      pump();
      return;
    }
    if (item.state !== "failed" || !item.photoId) return;
    item.state = "pending"; item.error = null; dirty.add(item); schedule();
    const response = await fetch(`/api/admin/photos/${item.photoId}/retry`, {
      method: "POST", credentials: "same-origin", headers: { "X-CSRF-Token": csrf(), Accept: "application/json" },
    }).catch(() => null);
    if (!response || !response.ok) {
      const data = response ? await response.json().catch(() => ({})) : {};
      item.state = "failed"; item.error = data.error || "The retry was not accepted."; dirty.add(item); schedule();
      return;
    }
    watch(item.uploadId);
  }

  list.addEventListener("click", (event) => {
    const button = event.target.closest("button.retry-one");
    if (button) retry(items[Number(button.dataset.index)]);
  });
  els["retry-all"].addEventListener("click", () => {
    items.filter((item) => item.state === "failed" || item.state === "transfer-failed").forEach(retry);
  });
  els["clear-finished"].addEventListener("click", () => {
    for (const item of items) {
      if ((item.state === "complete" || item.state === "duplicate") && item.row) { item.row.remove(); item.row = null; item.cleared = true; }
    }
  });

  window.addEventListener("beforeunload", (event) => {
    if (active > 0 || queue.length > 0) { event.preventDefault(); event.returnValue = ""; }
  });

  // --- drawing, once per frame ----------------------------------------------------------------------------
  function schedule() {
    if (!frame) frame = requestAnimationFrame(draw);
  }

  function draw() {
    frame = 0;
    const fresh = document.createDocumentFragment();
    for (const item of dirty) {
      if (item.cleared) continue;
      if (!item.row) { item.row = makeRow(item); fresh.appendChild(item.row); }
      drawRow(item);
    }
    dirty.clear();
    if (fresh.childNodes.length) list.appendChild(fresh);
    drawSummary();
  }

  function makeRow(item) {
    const row = document.createElement("li");
    row.className = "up-item";
    row.innerHTML = '<span class="up-name"></span><progress max="1" value="0"></progress>' +
      '<span class="up-state"></span><span class="up-error"></span>';
    row.querySelector(".up-name").textContent = item.name;
    row.dataset.index = String(item.index);
    return row;
  }

  function drawRow(item) {
    const row = item.row;
    row.className = `up-item up-${item.state}`;
    row.querySelector("progress").value = item.size ? item.sent / item.size : 1;
    row.querySelector(".up-state").textContent = LABELS[item.state] || item.state;
    row.querySelector(".up-error").textContent = item.error || "";
    let button = row.querySelector("button.retry-one");
    const canRetry = item.state === "failed" || item.state === "transfer-failed";
    if (canRetry && !button) {
      button = document.createElement("button");
      button.type = "button"; button.className = "retry-one small"; button.textContent = "Retry";
      button.dataset.index = String(item.index);
      row.appendChild(button);
    } else if (!canRetry && button) {
      button.remove();
    }
  }

  function drawSummary() {
    let sent = 0, done = 0, failed = 0, dupes = 0, processing = 0, bytes = 0, size = 0;
    for (const item of items) {
      bytes += item.sent; size += item.size;
      if (!["queued", "sending", "transfer-failed"].includes(item.state)) sent += 1;
      if (item.state === "complete") done += 1;
      else if (item.state === "failed" || item.state === "transfer-failed") failed += 1;
      else if (item.state === "duplicate") dupes += 1;
      else if (item.state === "pending" || item.state === "processing") processing += 1;
    }
    els["up-sent"].textContent = String(sent);
    els["up-total"].textContent = String(items.length);
    els["up-done"].textContent = String(done);
    els["up-failed"].textContent = String(failed);
    els["up-dupes"].textContent = String(dupes);
    els["up-processing"].textContent = String(processing);
    els["up-progress"].value = size ? bytes / size : 0;
    els["retry-all"].hidden = failed === 0;
    els["clear-finished"].hidden = done + dupes === 0;
    section.dataset.state = active > 0 || queue.length > 0 ? "sending" : processing > 0 ? "processing" : "idle";
  }
})();
