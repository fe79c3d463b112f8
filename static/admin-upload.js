// The bulk uploader on the admin gallery page: page glue around PicpeakUploadQueue (upload-queue.js).
//
// Files (chosen, dropped, or whole folders) go up as resumable tus uploads (upload-queue.js), one upload
// group per batch of BATCH_FILES (and at most BATCH_BYTES, both
// well inside the server's admin_max_files and request cap) with PARALLEL requests at a time. Each row shows
// its photo's real state from the live feed; the bar counts processed photos, not bytes sent. Choosing files
// brings the progress into view, and the summary stays in view (sticky) while the list grows below it. Failed,
// refused and unsent files move to the top of the list, and the summary links to them.
"use strict";

(() => {
  const section = document.getElementById("upload");
  if (!section) return;
  const _ = window.PicpeakHttp.t;
  const ngettext = window.PicpeakHttp.nt;

  const BATCH_FILES = 20;
  const BATCH_BYTES = 200 * 1024 * 1024;
  const PARALLEL = 3;
  const IMAGE_NAME = /\.(jpe?g|png|webp|heic|heif|mp4|mov|m4v|webm)$/i;
  const LABELS = {
    queued: _("Queued"), waiting: _("Waiting"), pending: _("Sent · waiting to be processed"),
    processing: _("Processing…"), complete: _("Ready"), failed: _("Failed"), duplicate: _("Already in the gallery"),
    refused: _("Refused"), unsent: _("Not sent"), lost: _("Progress unknown"),
  };

  const PROBLEMS = new Set(["failed", "refused", "unsent", "lost"]);

  const list = document.getElementById("upload-list");
  const summaryBox = document.getElementById("upload-summary");
  const els = {};
  for (const id of ["up-sent", "up-total", "up-done", "up-failed", "up-dupes", "up-processing", "up-progress",
                    "up-percent", "up-photos", "up-refused", "up-problems", "up-problems-link", "retry-all", "clear-finished"]) els[id] = document.getElementById(id);

  // Resumable (tus) uploads in pieces of at most 8 MB, or less when the server says so (upload_chunk_mb).
  const CHUNK_BYTES = Math.min(8, Number(section.dataset.chunkMb) || 8) * 1024 * 1024;
  const queue = window.PicpeakUploadQueue.create({
    url: section.dataset.uploadUrl,
    tus: section.dataset.tusUrl ? { url: section.dataset.tusUrl, chunkBytes: CHUNK_BYTES } : null,
    batchFiles: BATCH_FILES, batchBytes: BATCH_BYTES, parallel: PARALLEL,
    follow: (uploadId) => ({ wsPath: `/ws/uploads/${uploadId}`, statusUrl: `/api/admin/uploads/${uploadId}` }),
    retryUrl: (photoId) => (photoId ? `/api/admin/photos/${photoId}/retry` : null),
    onUpdate: draw,
  });

  // --- uploads left unfinished by an earlier visit (a reload, a closed tab) ------------------------------------
  // The browser cannot reopen a file by itself: the page names them, and choosing one again resumes it.
  const unfinishedNote = document.getElementById("up-unfinished");
  let unfinished = [];
  const drawUnfinished = () => {
    const left = unfinished.filter((u) => !queue.items.some((item) => item.name === u.name && item.size === u.size));
    unfinishedNote.hidden = left.length === 0;
    if (!left.length) return;
    const files = left.map((u) => _("%(name)s (%(percent)s %% sent)", { name: u.name, percent: Math.floor(100 * u.sent) }))
      .join(", ");
    unfinishedNote.textContent = ngettext("%(num)d unfinished upload: choose the file again to resume. %(files)s",
      "%(num)d unfinished uploads: choose the files again to resume. %(files)s", left.length, { files });
  };
  if (section.dataset.tusUrl) {
    window.PicpeakUploadQueue.unfinished(section.dataset.tusUrl).then((found) => { unfinished = found; drawUnfinished(); });
  }

  // --- choosing files -------------------------------------------------------------------------------------
  const addFiles = (files) => {
    const images = files.filter((f) => /^(image|video)\//.test(f.type) || IMAGE_NAME.test(f.name));
    if (!images.length) return;
    summaryBox.hidden = false;
    queue.add(images);
    // At 1440x900 the list starts below the fold: bring the progress into view so the choice visibly did something.
    requestAnimationFrame(() => summaryBox.scrollIntoView({ block: "start", behavior: "smooth" }));
  };

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
  const collect = async (entry, out) => {
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
  };

  // --- actions --------------------------------------------------------------------------------------------
  list.addEventListener("click", (event) => {
    const button = event.target.closest("button.retry-one");
    if (button) queue.retry(queue.items[Number(button.dataset.index)]);
  });
  els["retry-all"].addEventListener("click", () => queue.retryAll());
  // The problems are the list's first rows: show them, however far the list or the page was scrolled.
  els["up-problems-link"].addEventListener("click", (event) => {
    event.preventDefault();
    list.scrollTop = 0;
    const first = list.querySelector(".up-problem");
    if (first) first.scrollIntoView({ block: "nearest" });
  });
  els["clear-finished"].addEventListener("click", () => queue.clearFinished());

  window.addEventListener("beforeunload", (event) => {
    if (queue.busy()) { event.preventDefault(); event.returnValue = ""; }
  });

  // --- drawing (the queue calls this at most once per frame, with the rows that changed) --------------------
  // A row that turns into a problem moves to the top of the list: the list scrolls inside its own box, and a
  // failed or refused file at the bottom of 500 rows would be out of sight (the summary's link shows them).
  function draw(changed, s) {
    const fresh = document.createDocumentFragment();
    const raised = [];
    for (const item of changed) {
      if (item.cleared) {
        if (item.row) { item.row.remove(); item.row = null; }
        continue;
      }
      if (!item.row) { item.row = makeRow(item); fresh.appendChild(item.row); }
      const was = item.row.dataset.state;
      drawRow(item);
      if (PROBLEMS.has(item.state) && !PROBLEMS.has(was)) raised.push(item.row);
    }
    if (fresh.childNodes.length) list.appendChild(fresh);
    for (const row of raised.reverse()) list.prepend(row);
    drawSummary(s);
    if (unfinished.length) drawUnfinished();
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

  function rowLabel(item) {
    // Queued: not being sent yet (a file is "Sending" only while its own bytes go up, three at a time).
    if (item.state === "queued" && item.sent > 0) {
      return _("Queued · %(percent)s %% sent earlier", { percent: Math.round(100 * item.sent) });
    }
    if (item.state === "sending") {
      const sending = _("Sending %(percent)s %%", { percent: Math.round(100 * item.sent) });
      return item.paused && item.error ? `${sending} · ${item.error}` : sending;
    }
    if (item.state === "refused") {
      return _("Refused: %(reason)s", { reason: item.error || _("the server did not accept this file.") });
    }
    const label = LABELS[item.state] || item.state;
    return item.retries && item.state !== "complete"
      ? _("%(state)s (retry %(num)s)", { state: label, num: item.retries }) : label;
  }

  function drawRow(item) {
    const row = item.row;
    row.className = `up-item up-${item.state}${PROBLEMS.has(item.state) ? " up-problem" : ""}`;
    row.dataset.state = item.state;
    // The row's bar is its transfer: full once the server has the file, empty when it was not taken.
    const taken = ["pending", "processing", "complete", "failed", "duplicate", "lost"].includes(item.state);
    row.querySelector("progress").value = taken ? 1 : item.state === "sending" ? item.sent : 0;
    row.querySelector(".up-state").textContent = rowLabel(item);
    // A refusal says its reason in the label; the other end states keep it beside the label.
    row.querySelector(".up-error").textContent = item.state === "refused" ? "" : item.error || "";
    let button = row.querySelector("button.retry-one");
    const canRetry = queue.canRetry(item);
    if (canRetry && !button) {
      button = document.createElement("button");
      button.type = "button"; button.className = "retry-one small"; button.textContent = _("Retry");
      button.dataset.index = String(item.index);
      row.appendChild(button);
    } else if (!canRetry && button) {
      button.remove();
    }
  }

  function drawSummary(s) {
    els["up-sent"].textContent = String(s.sent);
    els["up-total"].textContent = String(s.total);
    els["up-done"].textContent = String(s.complete);
    els["up-failed"].textContent = String(s.failed + s.unsent);
    els["up-refused"].textContent = String(s.refused);
    els["up-dupes"].textContent = String(s.duplicates);
    els["up-processing"].textContent = String(s.processing);
    // Processed photos over all photos (a refused file is no photo): bytes sent say nothing about when the last
    // photo is ready.
    const share = s.photos ? s.processed / s.photos : 0;
    els["up-progress"].value = share;
    els["up-percent"].textContent = _("%(percent)s %%", { percent: Math.floor(100 * share) });
    els["up-photos"].textContent = ngettext("%(done)s of %(num)d photo", "%(done)s of %(num)d photos", s.photos,
      { done: s.processed });
    const problems = s.failed + s.unsent + s.refused;
    els["up-problems"].hidden = problems === 0;
    const problemText = ngettext("%(num)d file needs attention", "%(num)d files need attention", problems);
    if (els["up-problems-link"].textContent !== problemText) els["up-problems-link"].textContent = problemText;
    els["retry-all"].hidden = s.retryable === 0;
    els["clear-finished"].hidden = s.clearable === 0;
    section.dataset.state = s.busy ? "sending" : s.processing > 0 ? "processing" : "idle";
  }
})();
