// The guest upload page: a few files in flight at once (one file per request, so one slow or bad file does
// not hold up or sink the rest), transfer progress per file, then each file's processing live over the
// WebSocket (PicpeakLive.watchUpload, polling when it is missing), thumbnails as files finish, per-file
// errors, retry of a failed transfer, and a confirmation before leaving while anything is still sending.
// When the server asks to slow down (429), the queue waits for its Retry-After and carries on by itself. When
// the upload can no longer be followed (gallery unpublished or expired, password changed, session gone: 401,
// 403, 404, 410), following stops and each photo still processing says why, as does a note on the page.
(function () {
  "use strict";

  var form = document.getElementById("upload-form");
  if (!form) return;
  var PARALLEL = 3;
  var STOP_STATUSES = {
    401: "The gallery now asks for its password.",
    403: "You can no longer see this gallery.",
    404: "This gallery is no longer available, or your browser session has ended.",
    410: "This gallery has expired."
  };
  var csrfMeta = document.querySelector('meta[name="csrf-token"]');
  var csrf = csrfMeta ? csrfMeta.content : "";
  var input = document.getElementById("file-input");
  var drop = document.getElementById("drop");
  var list = document.getElementById("files");
  var summary = document.getElementById("summary");
  var viewGallery = document.getElementById("view-gallery");
  var rowTemplate = document.getElementById("file-row");
  var maxBytes = Number(form.dataset.maxMb) * 1024 * 1024;

  var items = [];
  var queue = [];
  var sending = 0;
  var byPhotoId = {};
  var watched = {};
  var resumeAt = 0;  // Date.now() before which nothing is sent (the server said 429)
  var resumeTimer = 0;

  function setStatus(item, text, kind) {
    item.row.querySelector(".file-status").textContent = text;
    item.row.classList.toggle("is-done", kind === "done");
    item.row.classList.toggle("is-error", kind === "error");
    item.row.dataset.state = kind || "";
    updateSummary();
  }

  function updateSummary() {
    var done = 0, failed = 0;
    items.forEach(function (it) {
      if (it.state === "done") done += 1;
      if (it.state === "error" || it.state === "transfer-failed") failed += 1;
    });
    var parts = [done + " of " + items.length + " done"];
    if (failed) parts.push(failed + " failed");
    summary.textContent = items.length ? parts.join(" · ") : "";
    if (done) viewGallery.hidden = false;
  }

  function addFiles(files) {
    Array.prototype.forEach.call(files, function (file) {
      var row = rowTemplate.content.firstElementChild.cloneNode(true);
      row.querySelector(".file-name").textContent = file.name;
      var item = {file: file, row: row, state: "queued", photoId: null};
      row.querySelector(".retry").addEventListener("click", function () { retry(item); });
      items.push(item);
      list.appendChild(row);
      if (maxBytes && file.size > maxBytes) {
        item.state = "error";
        row.querySelector("progress").hidden = true;
        setStatus(item, "Too large: the limit is " + form.dataset.maxMb + " MB per photo.", "error");
        return;
      }
      queue.push(item);
    });
    updateSummary();
    pump();
  }

  function pump() {
    var wait = resumeAt - Date.now();
    if (wait > 0) {
      clearTimeout(resumeTimer);
      resumeTimer = setTimeout(pump, wait);
      return;
    }
    while (sending < PARALLEL && queue.length) send(queue.shift());
  }

  function slowDown(item, seconds) {
    resumeAt = Math.max(resumeAt, Date.now() + seconds * 1000);
    item.state = "queued";
    item.row.querySelector("progress").hidden = true;
    var wait = seconds > 90 ? "about " + Math.ceil(seconds / 60) + " minutes" : seconds + " seconds";
    setStatus(item, "Waiting: the server asked to slow down. Sending again in " + wait + "…", "sending");
    queue.unshift(item);
    pump();
  }

  function send(item) {
    sending += 1;
    item.state = "sending";
    var progress = item.row.querySelector("progress");
    progress.hidden = false;
    progress.value = 0;
    item.row.querySelector(".retry").hidden = true;
    setStatus(item, "Uploading…", "sending");
    var data = new FormData();
    var name = form.elements.guest_name.value.trim();
    if (name) data.append("guest_name", name);
    data.append("photos", item.file, item.file.name);
    var xhr = new XMLHttpRequest();
    xhr.open("POST", form.dataset.endpoint);
    xhr.setRequestHeader("X-CSRF-Token", csrf);
    xhr.setRequestHeader("Accept", "application/json");
    xhr.upload.onprogress = function (event) {
      if (event.lengthComputable) progress.value = Math.round(100 * event.loaded / event.total);
    };
    xhr.onload = function () { received(item, xhr); finished(); };  // a 429 pauses the queue before it moves on
    xhr.onerror = xhr.ontimeout = xhr.onabort = function () {
      finished();
      transferFailed(item, "The transfer was interrupted. Check your connection and retry.");
    };
    xhr.send(data);

    function finished() { sending -= 1; pump(); }
  }

  function received(item, xhr) {
    var body = null;
    try { body = JSON.parse(xhr.responseText); } catch (error) { body = null; }
    var progress = item.row.querySelector("progress");
    if (xhr.status === 202 && body) {
      progress.value = 100;
      var photo = (body.photos || [])[0];
      var error = (body.errors || [])[0];
      if (photo && photo.duplicate) {
        item.state = "done";
        progress.hidden = true;
        setStatus(item, "Already in the gallery.", "done");
      } else if (photo) {
        item.state = "processing";
        item.photoId = photo.id;
        item.uploadId = body.upload_id;
        byPhotoId[photo.id] = item;
        setStatus(item, "Uploaded · processing…", "processing");
        if (body.upload_id) watch(body.upload_id);
      } else if (error) {
        fail(item, error.error);
      }
      return;
    }
    var message = body && ((body.errors && body.errors[0] && body.errors[0].error) || body.error);
    if (xhr.status === 429) {
      slowDown(item, Math.max(1, Number(xhr.getResponseHeader("Retry-After")) || 10));
    } else if (xhr.status >= 500 || xhr.status === 0) {
      transferFailed(item, message || "The server could not take this photo right now. Please retry.");
    } else {
      fail(item, message || "This photo was refused (error " + xhr.status + ").");
    }
  }

  function fail(item, message) {
    item.state = "error";
    item.row.querySelector("progress").hidden = true;
    setStatus(item, message, "error");
  }

  function transferFailed(item, message) {
    item.state = "transfer-failed";
    item.row.querySelector("progress").hidden = true;
    item.row.querySelector(".retry").hidden = false;
    setStatus(item, message, "error");
  }

  function retry(item) {
    if (item.state !== "transfer-failed") return;
    item.state = "queued";
    queue.push(item);
    pump();
  }

  // ---- Processing, live ----------------------------------------------------------------------------------
  function applyPhoto(p) {
    var item = byPhotoId[p.id];
    if (!item || item.state === "done" || item.state === "error") return;
    var progress = item.row.querySelector("progress");
    if (p.status === "complete") {
      item.state = "done";
      progress.hidden = true;
      if (p.thumb_url) {
        var img = document.createElement("img");
        img.src = p.thumb_url;
        img.alt = "";
        if (p.width && p.height) { img.width = p.width; img.height = p.height; }
        var thumb = item.row.querySelector(".file-thumb");
        thumb.textContent = "";
        thumb.appendChild(img);
      }
      setStatus(item, "Done", "done");
    } else if (p.status === "failed") {
      fail(item, p.error || "This photo could not be processed.");
    } else if (p.status === "processing") {
      setStatus(item, "Processing…", "processing");
    }
  }

  function applyStatus(status) { (status.photos || []).forEach(applyPhoto); }

  function watch(uploadId) {
    if (watched[uploadId]) return;
    var statusUrl = form.dataset.statusBase + uploadId;
    if (window.PicpeakLive && typeof window.PicpeakLive.watchUpload === "function") {
      watched[uploadId] = window.PicpeakLive.watchUpload({
        wsPath: "/ws/uploads/" + uploadId, statusUrl: statusUrl,
        onSnapshot: applyStatus, onPhoto: applyPhoto, onDone: applyStatus,
        // Asks the status endpoint once more: it answers with the state, or with why it cannot be followed.
        onError: function () { poll(uploadId, statusUrl); }
      });
    } else {
      watched[uploadId] = poll(uploadId, statusUrl);
    }
  }

  function poll(uploadId, statusUrl) {
    var stopped = false;
    function tick() {
      if (stopped) return;
      fetch(statusUrl, {credentials: "same-origin", headers: {"Accept": "application/json"}})
        .then(function (r) {
          if (r.ok) {
            return r.json().then(function (status) {
              applyStatus(status);
              if (!status.done) setTimeout(tick, 1500);
            });
          }
          if (STOP_STATUSES[r.status]) {
            stopped = true;
            return r.json().catch(function () { return null; }).then(function (body) {
              cannotFollow(uploadId, (body && body.error) || STOP_STATUSES[r.status]);
            });
          }
          setTimeout(tick, 3000);  // busy or briefly broken (429, 5xx): ask again later
        })
        .catch(function () { if (!stopped) setTimeout(tick, 3000); });
    }
    tick();
    return {close: function () { stopped = true; }};
  }

  // The upload can no longer be followed: say so on every photo of it still in progress, and once on the page.
  function cannotFollow(uploadId, reason) {
    items.forEach(function (item) {
      if (item.uploadId === uploadId && item.state === "processing") {
        fail(item, "Uploaded, but its progress can no longer be shown. " + reason);
      }
    });
    var note = document.getElementById("upload-stopped");
    if (!note) {
      note = document.createElement("p");
      note.id = "upload-stopped";
      note.className = "notice";
      note.setAttribute("role", "alert");
      summary.parentNode.insertBefore(note, summary.nextSibling);
    }
    note.textContent = reason + " Reload the page to see where things stand.";
  }

  // ---- Choosing and dropping -------------------------------------------------------------------------------
  input.addEventListener("change", function () {
    addFiles(input.files);
    input.value = "";
  });
  ["dragenter", "dragover"].forEach(function (type) {
    drop.addEventListener(type, function (event) { event.preventDefault(); drop.classList.add("is-over"); });
  });
  ["dragleave", "drop"].forEach(function (type) {
    drop.addEventListener(type, function () { drop.classList.remove("is-over"); });
  });
  drop.addEventListener("drop", function (event) {
    event.preventDefault();
    if (event.dataTransfer && event.dataTransfer.files.length) addFiles(event.dataTransfer.files);
  });
  // A file dropped beside the zone must not navigate away from the page.
  window.addEventListener("dragover", function (event) { event.preventDefault(); });
  window.addEventListener("drop", function (event) { event.preventDefault(); });

  window.addEventListener("beforeunload", function (event) {
    if (sending > 0 || queue.length > 0) {
      event.preventDefault();
      event.returnValue = "";
    }
  });
})();
