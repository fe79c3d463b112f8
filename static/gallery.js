// The guest gallery: more photos as the guest scrolls, the lightbox, hearts, the guest name, live updates.
// No inline script or style anywhere (CSP): everything hangs off ids and data- attributes in gallery.html.
(function () {
  "use strict";

  const _ = window.PicpeakHttp.t;
  const ngettext = window.PicpeakHttp.nt;
  const grid = document.getElementById("grid");
  if (!grid) return;
  const more = document.getElementById("more");
  const loadMoreButton = document.getElementById("load-more");
  const tileTemplate = document.getElementById("tile-template");
  const favouritesOnly = grid.dataset.favouritesOnly === "1";
  let loading = false;

  // ---- Pages after the first -------------------------------------------------------------------------------
  function tileFor(photo) {
    const li = tileTemplate.content.firstElementChild.cloneNode(true);
    li.dataset.id = String(photo.id);
    li.classList.replace("r20", photo.ratio_class);  // the justified grid's aspect class (guest.css)
    li.classList.toggle("is-favourite", !!photo.favourite);
    const link = li.querySelector(".tile-link");
    link.href = photo.view_url;
    link.dataset.view = photo.view_url;
    link.dataset.srcset = photo.srcset;
    link.dataset.width = photo.width;
    link.dataset.height = photo.height;
    link.dataset.taken = photo.taken || "";
    link.dataset.camera = photo.camera || "";
    link.dataset.download = photo.download_url || "";
    link.dataset.downloadWeb = photo.web_download_url || "";
    link.dataset.alt = photo.alt || "";
    link.dataset.play = photo.play_url || "";
    link.dataset.note = photo.play_note || "";
    const badge = li.querySelector(".play-badge");
    badge.hidden = !photo.duration;
    badge.textContent = "\u25B6 " + (photo.duration || "");
    const img = li.querySelector("img");
    img.width = photo.width;
    img.height = photo.height;
    img.alt = photo.alt || "";
    img.srcset = photo.srcset;  // the grid and the view with their real widths (guest.py PhotoUrls.srcset)
    img.src = photo.grid_url;
    li.querySelector(".heart").setAttribute("aria-pressed", photo.favourite ? "true" : "false");
    return li;
  }

  function loadMore() {
    const cursor = grid.dataset.next;
    if (loading || !cursor) return;
    loading = true;
    if (loadMoreButton) loadMoreButton.disabled = true;
    const url = grid.dataset.api + (grid.dataset.api.indexOf("?") < 0 ? "?" : "&") + "after=" + encodeURIComponent(cursor);
    window.PicpeakHttp.json(url)
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.data; })
      .then(function (page) {
        const fragment = document.createDocumentFragment();
        page.photos.forEach(function (p) {
          if (!grid.querySelector('.tile[data-id="' + p.id + '"]')) fragment.appendChild(tileFor(p));
        });
        grid.appendChild(fragment);
        grid.dataset.next = page.next || "";
        if (!page.next && more) more.hidden = true;
      })
      .catch(function () { /* the button stays, the guest can try again */ })
      .then(function () { loading = false; if (loadMoreButton) loadMoreButton.disabled = false; });
  }

  if (loadMoreButton) loadMoreButton.addEventListener("click", loadMore);
  if (more && "IntersectionObserver" in window) {
    new IntersectionObserver(function (entries) {
      if (entries.some(function (e) { return e.isIntersecting; })) loadMore();
    }, {rootMargin: "1200px 0px"}).observe(more);
  }

  // ---- Hearts ------------------------------------------------------------------------------------------------
  const favCounts = document.querySelectorAll(".fav-count");
  let saidTimer = 0;

  // A refused heart says why where the guest is looking: a toast at the foot of the screen (guest.css), moved
  // into the lightbox while it is open (a modal dialog covers everything outside it).
  function sayRefusal(text) {
    const said = document.getElementById("favourite-error");  // the limit's sentence (guest/_favourite_limit.html)
    if (!said) return;
    clearTimeout(saidTimer);
    said.textContent = text;
    said.hidden = !text;
    if (!text) return;
    const place = box.open ? box : document.body;
    if (said.parentNode !== place) place.appendChild(said);
    saidTimer = setTimeout(function () { said.hidden = true; }, 8000);
  }

  function setFavourite(id, on) {
    const tile = grid.querySelector('.tile[data-id="' + id + '"]');
    return window.PicpeakHttp.json(grid.dataset.favouriteUrl + id, {method: on ? "PUT" : "DELETE"}).then(function (r) {
      sayRefusal(r.ok ? "" : (r.data && r.data.error) || _("Your favourite could not be saved. Please try again."));
      if (!r.ok) throw new Error("HTTP " + r.status);
      return r.data;
    }).then(function (result) {
      if (tile) {
        tile.classList.toggle("is-favourite", result.favourite);
        tile.querySelector(".heart").setAttribute("aria-pressed", result.favourite ? "true" : "false");
      }
      favCounts.forEach(function (el) { el.textContent = String(result.count); });
      if (current && current.dataset.id === String(id)) syncLightboxHeart();
      return result;
    });
  }

  grid.addEventListener("click", function (event) {
    const heart = event.target.closest(".heart");
    if (heart) {
      event.preventDefault();
      const tile = heart.closest(".tile");
      setFavourite(tile.dataset.id, heart.getAttribute("aria-pressed") !== "true").catch(function () {});
      return;
    }
    const link = event.target.closest(".tile-link");
    if (link && !event.metaKey && !event.ctrlKey && !event.shiftKey) {
      event.preventDefault();
      openLightbox(link.closest(".tile"));
    }
  });

  const nameForm = document.getElementById("guest-name");
  if (nameForm) {
    nameForm.addEventListener("submit", function (event) {
      event.preventDefault();
      const status = nameForm.querySelector(".guest-name-status");
      const body = {name: nameForm.elements.name.value};
      window.PicpeakHttp.json(nameForm.getAttribute("action"), {method: "POST", body: body})
        .then(function (r) { return r.ok ? r.data : Promise.reject(r); })
        .then(function () { status.textContent = _("Saved."); })
        .catch(function () { status.textContent = _("Could not save your name. Please try again."); });
    });
  }

  // ---- Lightbox ----------------------------------------------------------------------------------------------
  const box = document.getElementById("lightbox");
  const boxImg = document.getElementById("lb-img");
  const boxVideo = document.getElementById("lb-video");
  const boxNote = box.querySelector(".lb-note");
  let current = null;
  let opener = null;

  function tiles() { return Array.prototype.slice.call(grid.querySelectorAll(".tile")); }

  function show(tile) {
    if (!tile) return;
    current = tile;
    const link = tile.querySelector(".tile-link");
    boxImg.removeAttribute("src");
    boxImg.width = Number(link.dataset.width);
    boxImg.height = Number(link.dataset.height);
    boxImg.srcset = link.dataset.srcset || "";  // none after a replacement (see the live part below)
    boxImg.sizes = "100vw";
    boxImg.src = link.dataset.view;
    boxImg.alt = link.dataset.alt;
    // A video plays its original (or playable copy) with the poster; the poster stays as an image until then.
    stopVideo();
    if (link.dataset.play) {
      boxVideo.poster = link.dataset.view;
      boxVideo.src = link.dataset.play;
      boxVideo.hidden = false;
      boxImg.hidden = true;
    }
    boxNote.textContent = link.dataset.note;
    boxNote.hidden = !link.dataset.note;
    box.querySelector(".lb-date").textContent = link.dataset.taken;
    box.querySelector(".lb-camera").textContent = link.dataset.camera;
    const download = box.querySelector(".lb-download:not(.lb-download-web)");
    download.hidden = !link.dataset.download;
    if (link.dataset.download) download.href = link.dataset.download;
    const web = box.querySelector(".lb-download-web");
    web.hidden = !link.dataset.downloadWeb;
    if (link.dataset.downloadWeb) web.href = link.dataset.downloadWeb;
    syncLightboxHeart();
    box.dispatchEvent(new CustomEvent("picpeak:show", {detail: {id: Number(tile.dataset.id)}}));  // feedback.js
    const all = tiles();
    const index = all.indexOf(tile);
    box.querySelector(".lb-prev").disabled = index <= 0;
    box.querySelector(".lb-next").disabled = index >= all.length - 1 && !grid.dataset.next;
    // Warm the neighbours so that "next" is instant.
    [all[index + 1], all[index - 1]].forEach(function (t) {
      if (t) { const pre = new Image(); pre.src = t.querySelector(".tile-link").dataset.view; }
    });
    if (index >= all.length - 3) loadMore();
  }

  function stopVideo() {
    boxVideo.pause();
    boxVideo.removeAttribute("src");
    boxVideo.load();
    boxVideo.hidden = true;
    boxImg.hidden = false;
  }

  function syncLightboxHeart() {
    if (!current) return;
    box.querySelector(".lb-fav").setAttribute("aria-pressed", current.classList.contains("is-favourite") ? "true" : "false");
  }

  function openLightbox(tile) {
    opener = tile.querySelector(".tile-link");
    show(tile);
    if (typeof box.showModal === "function") box.showModal(); else box.setAttribute("open", "");
    document.documentElement.classList.add("lb-open");
    box.querySelector(".lb-next").focus({preventScroll: true});
  }

  function closeLightbox() {
    if (box.open) box.close();
  }

  function step(delta) {
    if (!current) return;
    const all = tiles();
    const next = all[all.indexOf(current) + delta];
    if (next) show(next);
  }

  box.addEventListener("close", function () {
    document.documentElement.classList.remove("lb-open");
    boxImg.removeAttribute("src");
    boxImg.removeAttribute("srcset");
    stopVideo();
    if (current) current.scrollIntoView({block: "nearest"});
    if (opener) opener.focus({preventScroll: true});
    current = null;
  });
  box.querySelector(".lb-close").addEventListener("click", closeLightbox);
  box.querySelector(".lb-prev").addEventListener("click", function () { step(-1); });
  box.querySelector(".lb-next").addEventListener("click", function () { step(1); });
  box.querySelector(".lb-fav").addEventListener("click", function () {
    if (current) setFavourite(current.dataset.id, !current.classList.contains("is-favourite")).catch(function () {});
  });
  box.addEventListener("keydown", function (event) {
    if (event.key === "ArrowRight") { event.preventDefault(); step(1); }
    else if (event.key === "ArrowLeft") { event.preventDefault(); step(-1); }
    // Escape is the dialog's own: it fires "close".
  });
  // A click on the dark backdrop (not on the photo or a control) closes.
  box.addEventListener("click", function (event) {
    if (event.target === box || event.target.classList.contains("lb-stage")) closeLightbox();
  });
  let touchX = null, touchY = null;
  box.addEventListener("touchstart", function (event) {
    if (event.touches.length === 1) { touchX = event.touches[0].clientX; touchY = event.touches[0].clientY; }
  }, {passive: true});
  box.addEventListener("touchend", function (event) {
    if (touchX === null) return;
    const dx = event.changedTouches[0].clientX - touchX, dy = event.changedTouches[0].clientY - touchY;
    touchX = null;
    if (Math.abs(dx) > 50 && Math.abs(dx) > 1.5 * Math.abs(dy)) {
      box.classList.add("lb-swiped");  // the guest knows now: the swipe hint goes (guest.css)
      step(dx < 0 ? 1 : -1);
    }
    else if (dy > 90 && Math.abs(dy) > 2 * Math.abs(dx)) closeLightbox();
  }, {passive: true});

  // ---- Live: new photos and removals -------------------------------------------------------------------------
  const notice = document.getElementById("new-photos");
  let newCount = 0;
  if (window.PicpeakLive && typeof window.PicpeakLive.watchGallery === "function" && !favouritesOnly &&
      grid.dataset.wsPath) {  // no path: the photographer's preview, which the guest feed would refuse
    window.PicpeakLive.watchGallery({
      wsPath: grid.dataset.wsPath,
      onPhoto: function (delta) {
        const tile = grid.querySelector('.tile[data-id="' + delta.id + '"]');
        if (delta.status === "removed") {
          if (tile) {
            if (current === tile) closeLightbox();
            tile.remove();
          }
        } else if (delta.status === "complete" && tile) {
          // Replaced by a new version (or reverted): its images again, past the browser's cache of the old ones.
          const bust = (url) => url + (url.includes("?") ? "&" : "?") + "v=" + delta.seq;
          const link = tile.querySelector(".tile-link");
          const img = tile.querySelector("img");
          if (delta.view_url) { link.href = bust(delta.view_url); link.dataset.view = link.href; }
          delete link.dataset.srcset;
          if (delta.width && delta.height) { link.dataset.width = delta.width; link.dataset.height = delta.height; }
          if (img && delta.thumb_url) { img.removeAttribute("srcset"); img.src = bust(delta.thumb_url); }
        } else if (delta.status === "complete" && !tile) {
          newCount += 1;
          notice.querySelector(".notice-text").textContent =
            ngettext("%(num)d new photo", "%(num)d new photos", newCount);
          notice.hidden = false;
        }
      },
      onFeedback: function (msg) {  // likes, ratings, comments: feedback.js shows them
        box.dispatchEvent(new CustomEvent("picpeak:feedback", {detail: msg}));
      },
      onResync: function () {
        notice.querySelector(".notice-text").textContent = _("The gallery has changed.");
        notice.hidden = false;
      }
    });
  }

  // ---- Send my selection (email to the photographer; the texts come translated from the page) -----------------
  const sendSelection = document.getElementById("send-selection");
  if (sendSelection) {
    sendSelection.addEventListener("click", async function () {
      const status = document.getElementById("send-selection-status");
      sendSelection.disabled = true;
      const answer = await window.PicpeakHttp.json(sendSelection.dataset.url, { method: "POST" });
      status.textContent = answer.ok ? sendSelection.dataset.sent : (answer.data.error || "");
      sendSelection.disabled = answer.ok;
    });
  }
})();
