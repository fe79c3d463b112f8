// Progressive enhancements for the admin pages: copy buttons, confirmations, the live photo grid, the
// watermark preview. Every page works without this file (forms post and redirect); CSP allows no inline code.
// Needs http.js (PicpeakHttp) and live.js (PicpeakLive) loaded before it.
"use strict";

(() => {
  const _ = window.PicpeakHttp.t;
  const ngettext = window.PicpeakHttp.nt;

  // --- copy buttons -------------------------------------------------------------------------------------
  document.addEventListener("click", async (event) => {
    const button = event.target.closest("button.copy[data-copy]");
    if (!button) return;
    try {
      await navigator.clipboard.writeText(button.dataset.copy);
      const label = button.textContent;
      button.textContent = _("Copied");
      setTimeout(() => { button.textContent = label; }, 1500);
    } catch {
      const input = button.parentElement && button.parentElement.querySelector("[readonly]");
      if (input) input.select();
    }
  });

  document.addEventListener("click", (event) => {
    if (event.target.closest("button.print")) window.print();
  });

  // --- destructive actions confirm ----------------------------------------------------------------------
  document.addEventListener("submit", (event) => {
    const submitter = event.submitter;
    const form = event.target;
    const old = form.querySelector("input[name=confirm][data-added]");
    if (old) old.remove();
    if (!submitter || !submitter.dataset.confirm) return;
    if (!window.confirm(submitter.dataset.confirm)) { event.preventDefault(); return; }
    const input = document.createElement("input");
    input.type = "hidden"; input.name = "confirm"; input.value = "yes"; input.dataset.added = "1";
    form.appendChild(input);
  });

  // --- never a broken image: a failed <img> becomes a placeholder -----------------------------------------
  document.addEventListener("error", (event) => {
    const img = event.target;
    if (!(img instanceof HTMLImageElement) || img.dataset.fallback) return;
    if (img.id === "watermark-preview") { img.dataset.fallback = "1"; img.alt = _("The preview could not be made with these values."); return; }
    const holder = document.createElement("div");
    holder.className = "ph ph-waiting";
    holder.textContent = _("Image not available yet");
    const target = img.closest("a.thumb-link") || img;
    target.replaceWith(holder);
  }, true);

  // --- the photo grid -------------------------------------------------------------------------------------
  const photos = document.getElementById("photos");
  if (photos) setUpGrid(photos);

  function setUpGrid(section) {
    const grid = document.getElementById("grid");
    const form = document.getElementById("photo-actions");
    const countEl = document.getElementById("selected-count");
    const selectAll = document.getElementById("select-all");
    const filtered = new URLSearchParams(window.location.search).toString() !== "";

    function updateSelection() {
      const boxes = grid.querySelectorAll("input[name=ids]");
      const checked = grid.querySelectorAll("input[name=ids]:checked").length;
      countEl.textContent = ngettext("%(num)d selected", "%(num)d selected", checked);
      if (selectAll) selectAll.checked = checked > 0 && checked === boxes.length;
    }
    form.addEventListener("change", (event) => {
      if (event.target === selectAll) {
        grid.querySelectorAll("input[name=ids]").forEach((box) => { box.checked = selectAll.checked; });
      }
      updateSelection();
    });

    // Retry from the grid without reloading the page. The button is a submit button with a formaction (the
    // no-script path), so this listens for the form's submit and cancels it: one request, never the JS request
    // and the form post both. The tile counts the retries made from this page and says what is happening.
    form.addEventListener("submit", async (event) => {
      const button = event.submitter && event.submitter.closest("button.retry[data-photo-id]");
      if (!button) return;
      event.preventDefault();
      if (button.dataset.busy) return;
      button.dataset.busy = "1";
      button.disabled = true;
      const tile = button.closest("li[data-id]");
      const retries = Number(tile.dataset.retries || 0) + 1;
      tile.dataset.retries = String(retries);
      button.textContent = _("Retrying…");
      setNote(tile, _("Retry %(num)s: sending…", { num: retries }));
      const id = button.dataset.photoId;
      const answer = await window.PicpeakHttp.json(`/api/admin/photos/${id}/retry`, { method: "POST" });
      if (answer.ok) {
        // Unless the live feed got there first (a bad file fails again within milliseconds): its word is newer.
        if (button.isConnected && !pending.has(Number(id))) applyPhoto({ id: Number(id), status: "pending" });
      } else {
        tile.dataset.retries = String(retries - 1);
        delete button.dataset.busy;
        button.disabled = false;
        button.textContent = _("Retry");
        setNote(tile, answer.data.error || _("The photo could not be retried."));
      }
    });

    function setNote(tile, text) {
      const box = tile.querySelector(".ph");
      if (!box) return;
      let note = box.querySelector(".retry-note");
      if (!note) {
        note = document.createElement("span");
        note.className = "retry-note small"; note.setAttribute("role", "status");
        box.appendChild(note);
      }
      note.textContent = text;
    }

    // Live changes arrive one by one; the DOM is updated once per frame.
    const pending = new Map();
    let frame = 0;
    function applyPhoto(delta) {
      pending.set(delta.id, Object.assign(pending.get(delta.id) || {}, delta));
      if (!frame) frame = requestAnimationFrame(flush);
    }
    function flush() {
      frame = 0;
      for (const delta of pending.values()) updateTile(delta);
      pending.clear();
      const empty = document.getElementById("no-photos");
      if (empty && grid.children.length) empty.remove();
      updateSelection();
      refreshCounts();
    }

    // "Photos: N ready, M waiting" above follows the same feed. A filtered grid holds only some photos, so the
    // counts are asked of the server (the gallery's JSON has them), once per burst of changes, never two at once.
    const counts = document.getElementById("gallery-counts");
    let countsBusy = false, countsAgain = false;
    async function refreshCounts() {
      if (!counts) return;
      if (countsBusy) { countsAgain = true; return; }
      countsBusy = true;
      const answer = await window.PicpeakHttp.json(`/api/admin/galleries/${section.dataset.galleryId}`);
      if (answer.ok && answer.data.counts) counts.textContent = countsText(answer.data.counts);
      countsBusy = false;
      if (countsAgain) { countsAgain = false; refreshCounts(); }
    }
    function countsText(c) {
      // The same words as the server's template (admin/gallery.html).
      let text = _("%(num)s ready", { num: c.complete });
      if (c.waiting) text += ", " + _("%(num)s waiting", { num: c.waiting });
      if (c.failed) text += ", " + _("%(num)s failed", { num: c.failed });
      if (c.guest) text += ", " + _("%(num)s from guests", { num: c.guest });
      return text;
    }
    const byName = new Intl.Collator(undefined, { numeric: true, sensitivity: "base" });
    function updateTile(p) {
      let tile = grid.querySelector(`li[data-id="${p.id}"]`);
      if (p.status === "deleted") { if (tile) tile.remove(); return; }
      if (!tile) {
        if (filtered) return;  // a filtered view only changes on reload
        tile = document.createElement("li");
        tile.dataset.id = String(p.id);
        tile.innerHTML = '<label class="pick"><input type="checkbox" name="ids"><span class="visually-hidden"></span></label>' +
          '<div class="body"></div><div class="meta"><span class="name"></span></div>';
        tile.querySelector("input").value = String(p.id);
        tile.querySelector(".visually-hidden").textContent = p.filename ? _("Select %(name)s", { name: p.filename }) : _("Select photo");
        tile.querySelector(".name").textContent = p.filename || "";
        // The grid is in capture order, then by name (store/queries/admin_photos.py); a new photo's capture time
        // is not known before it is processed, so a live tile goes in by its name (IMG_0001 before IMG_0021,
        // whichever batch arrived first) until the next reload orders it exactly.
        const after = [...grid.querySelectorAll("li[data-id] .name")]
          .find((name) => byName.compare(name.textContent, p.filename || "") > 0);
        grid.insertBefore(tile, after ? after.closest("li") : null);
      }
      // Hiding and showing change only `hidden`: apply it even when the status (and so the body) stays.
      const hidden = "hidden" in p ? Boolean(p.hidden) : tile.classList.contains("is-hidden");
      tile.classList.toggle("is-hidden", hidden);
      setHiddenBadge(tile, hidden);
      if (tile.dataset.status === p.status && p.status === "complete") return;
      tile.dataset.status = p.status;
      tile.className = `tile tile-${p.status}` + (hidden ? " is-hidden" : "");
      let body = tile.querySelector(".body, .thumb-link, .ph");
      const next = tileBody(p, Number(tile.dataset.retries || 0));
      if (body) body.replaceWith(next); else tile.insertBefore(next, tile.querySelector(".meta"));
    }
    function setHiddenBadge(tile, hidden) {
      const meta = tile.querySelector(".meta");
      if (!meta) return;
      const badge = [...meta.querySelectorAll(".badge")].find((b) => b.textContent === _("Hidden"));
      if (hidden && !badge) {
        const added = document.createElement("span");
        added.className = "badge"; added.textContent = _("Hidden");
        const name = meta.querySelector(".name");
        meta.insertBefore(added, name ? name.nextSibling : meta.firstChild);
      } else if (!hidden && badge) {
        badge.remove();
      }
    }
    function tileBody(p, retries) {
      if (p.status === "complete") {
        const link = document.createElement("a");
        link.className = "thumb-link"; link.target = "_blank"; link.rel = "noopener";
        link.href = p.view_url || `/api/admin/photos/${p.id}/view`;
        const img = document.createElement("img");
        img.className = "thumb"; img.loading = "lazy"; img.alt = p.filename || "";
        img.src = p.thumb_url || `/api/admin/photos/${p.id}/grid`;
        link.appendChild(img);
        return link;
      }
      const box = document.createElement("div");
      if (p.status === "failed") {
        box.className = "ph ph-failed";
        const strong = document.createElement("strong"); strong.textContent = _("Failed");
        const reason = document.createElement("span"); reason.className = "reason"; reason.textContent = p.error || "";
        const retry = document.createElement("button");
        retry.type = "submit"; retry.className = "retry"; retry.dataset.photoId = String(p.id); retry.textContent = _("Retry");
        retry.setAttribute("formaction", `/admin/photos/${p.id}/retry`);
        box.append(strong, reason, retry);
        if (retries) {
          const note = document.createElement("span");
          note.className = "retry-note small";
          note.textContent = ngettext("Failed again after %(num)d retry", "Failed again after %(num)d retries", retries);
          box.append(note);
        }
      } else {
        box.className = "ph ph-waiting"; box.setAttribute("role", "status");
        if (retries) {
          box.textContent = p.status === "processing" ? _("Retry %(num)s: processing…", { num: retries })
            : _("Retry %(num)s: waiting…", { num: retries });
        } else {
          box.textContent = p.status === "processing" ? _("Processing…") : _("Waiting…");
        }
      }
      return box;
    }

    // After the live feed fell behind: one fresh look at the whole grid.
    async function resync() {
      const answer = await window.PicpeakHttp.json(section.dataset.photosUrl + window.location.search);
      if (!answer.ok) return;
      const data = answer.data;
      const seen = new Set(data.photos.map((p) => p.id));
      grid.querySelectorAll("li[data-id]").forEach((tile) => {
        if (!seen.has(Number(tile.dataset.id))) applyPhoto({ id: Number(tile.dataset.id), status: "deleted" });
      });
      data.photos.forEach(applyPhoto);
    }

    // Changes made anywhere (this page's uploader, another tab, the API) arrive over the live feed; without
    // it the grid is as fresh as the last reload (live.js decides on any fallback, nothing here polls).
    window.PicpeakLive.watchGallery({ wsPath: section.dataset.wsPath, onPhoto: applyPhoto, onResync: resync });
    updateSelection();
  }

  // --- watermark preview ----------------------------------------------------------------------------------
  const wmForm = document.getElementById("watermark-form");
  if (wmForm) {
    const preview = document.getElementById("watermark-preview");
    let timer = 0;
    const refresh = () => {
      const data = new FormData(wmForm);
      const params = new URLSearchParams();
      for (const name of ["watermark_text", "watermark_position", "watermark_opacity", "watermark_size"]) {
        params.set(name, data.get(name) || "");
      }
      if (data.get("watermark_use_logo")) params.set("watermark_use_logo", "on");
      document.getElementById("opacity-out").textContent = data.get("watermark_opacity");
      document.getElementById("size-out").textContent = data.get("watermark_size");
      delete preview.dataset.fallback;
      preview.src = `${wmForm.dataset.previewUrl}?${params}`;
    };
    wmForm.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(refresh, 200); });
    wmForm.addEventListener("change", () => { clearTimeout(timer); timer = setTimeout(refresh, 50); });
  }
})();
