// "Find me" (templates/guest/findme.html, web/views/findme.py): after the guest agrees to the notice, the front
// camera (getUserMedia) or a chosen photo; the picture is sent as the request's body, never kept in the page
// after the request; the results with a "Not me" on each, which hides that face and those like it.
"use strict";

(() => {
  const root = document.getElementById("findme");
  const consent = document.getElementById("consent");
  if (!root || !consent) return;
  // The page's strings (templates/guest/findme.html's script_strings block), in its language.
  const _ = window.PicpeakHttp.t;
  const camera = document.getElementById("camera");
  const video = document.getElementById("camera-video");
  const status = document.getElementById("findme-status");
  const results = document.getElementById("findme-results");
  const template = document.getElementById("findme-result");
  let stream = null;
  let shown = [];

  const say = (text) => { status.textContent = text; };

  const closeCamera = () => {
    if (stream) stream.getTracks().forEach((track) => track.stop());
    stream = null;
    video.srcObject = null;
    camera.hidden = true;
  };

  const show = (matches) => {
    results.replaceChildren();
    shown = matches.map((match) => ({ face: match.face_id, distance: match.distance }));
    matches.forEach((match, index) => {
      const item = template.content.firstElementChild.cloneNode(true);
      item.dataset.face = match.face_id;
      item.querySelector("a").href = match.view_url;
      const img = item.querySelector("img");
      img.src = match.grid_url;
      img.alt = _("Photo %(num)s", { num: index + 1 });
      item.querySelector(".findme-not-me").addEventListener("click", () => notMe(match.face_id));
      results.append(item);
    });
  };

  const search = async (blob) => {
    say(_("Looking for you in the photos…"));
    let response;
    try {
      response = await fetch(root.dataset.searchUrl, {
        method: "POST", credentials: "same-origin", body: blob,
        headers: { Accept: "application/json", "Content-Type": blob.type || "application/octet-stream",
                   "X-CSRF-Token": PicpeakHttp.csrfToken() },
      });
    } catch {
      say(_("The search failed; please try again."));
      return;
    }
    const data = await response.json().catch(() => ({}));
    if (!response.ok) {
      results.replaceChildren();
      say(data.error || _("The search failed; please try again."));
      return;
    }
    show(data.matches || []);
    say(data.message);
  };

  const notMe = async (face) => {
    const answer = await PicpeakHttp.json(root.dataset.notMeUrl, { method: "POST", body: { face, shown } });
    if (!answer.ok) {
      say(answer.data.error || _("The search failed; please try again."));
      return;
    }
    const hide = new Set(answer.data.hide || []);
    results.querySelectorAll(".findme-result").forEach((item) => {
      if (hide.has(Number(item.dataset.face))) item.remove();
    });
    shown = shown.filter((item) => !hide.has(item.face));
    say(answer.data.message);
  };

  document.getElementById("consent-camera").addEventListener("click", async () => {
    try {
      stream = await navigator.mediaDevices.getUserMedia({ video: { facingMode: "user" }, audio: false });
    } catch {
      say(_("The camera could not be opened. Choose a photo of yourself instead."));
      return;
    }
    video.srcObject = stream;
    camera.hidden = false;
  });

  document.getElementById("close-camera").addEventListener("click", closeCamera);

  document.getElementById("take-selfie").addEventListener("click", () => {
    const canvas = document.createElement("canvas");
    canvas.width = video.videoWidth;
    canvas.height = video.videoHeight;
    canvas.getContext("2d").drawImage(video, 0, 0);
    closeCamera();
    canvas.toBlob((blob) => { if (blob) search(blob); }, "image/jpeg", 0.9);
  });

  document.getElementById("selfie-file").addEventListener("change", (event) => {
    const file = event.target.files[0];
    event.target.value = "";
    if (file) search(file);
  });
})();
