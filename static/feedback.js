// Likes, a star rating and comments in the guest lightbox (templates/guest/_feedback.html). gallery.js tells
// which photo is shown ("picpeak:show") and passes on the gallery feed's feedback frames ("picpeak:feedback");
// this script reads the photo's feedback, sends the guest's like, stars and comments, and reads the comments
// again when the feed says the open photo's changed. What guests wrote goes in with textContent only, and
// every sentence comes translated from the panel's data- attributes. Needs http.js.
"use strict";

(function () {
  const box = document.getElementById("lightbox");
  const panel = document.getElementById("lb-feedback");
  if (!box || !panel || !window.PicpeakHttp) return;
  const toggle = box.querySelector(".lb-feedback-toggle");
  const countBadge = box.querySelector(".lb-comment-count");
  const likeButton = panel.querySelector(".fb-like");
  const likeCount = panel.querySelector(".fb-like-count");
  const average = panel.querySelector(".fb-average");
  const list = panel.querySelector(".fb-comments");
  const form = panel.querySelector(".fb-form");
  const nameField = panel.querySelector(".fb-name");
  const status = panel.querySelector(".fb-status");
  const msg = panel.dataset;
  let photoId = null;

  function url(what) { return msg.url + photoId + "/" + what; }

  function render(data) {
    likeButton.setAttribute("aria-pressed", data.liked ? "true" : "false");
    likeCount.textContent = data.likes ? String(data.likes) : "";
    average.textContent = data.rating === null ? ""
      : msg.msgAverage.replace("{rating}", data.rating.toFixed(1)).replace("{count}", String(data.ratings));
    panel.querySelectorAll('input[name="fb-stars"]').forEach(function (input) {
      input.checked = Number(input.value) === data.my_rating;
    });
    countBadge.textContent = data.comments ? String(data.comments) : "";
    if (data.comment_list) {
      list.replaceChildren();
      data.comment_list.forEach(function (c) {
        const li = document.createElement("li");
        li.className = "fb-comment" + (c.status === "held" ? " is-held" : "");
        const who = document.createElement("strong");
        who.textContent = c.name;
        const text = document.createElement("p");
        text.textContent = c.text;
        li.append(who, text);
        if (c.status === "held") {
          const note = document.createElement("p");
          note.className = "fb-held small";
          note.textContent = msg.msgWaiting;
          li.append(note);
        }
        list.append(li);
      });
    }
    if (data.name) nameField.hidden = true;
  }

  function load() {
    if (photoId === null) return;
    const asked = photoId;
    window.PicpeakHttp.json(url("feedback")).then(function (r) {
      if (r.ok && asked === photoId) render(r.data);
    });
  }

  function send(what, method, body) {
    status.textContent = "";
    return window.PicpeakHttp.json(url(what), {method: method, body: body}).then(function (r) {
      if (!r.ok) { status.textContent = (r.data && r.data.error) || msg.msgError; return null; }
      render(r.data);
      return r.data;
    });
  }

  box.addEventListener("picpeak:show", function (event) {
    photoId = event.detail.id;
    list.replaceChildren();
    status.textContent = "";
    countBadge.textContent = "";
    load();
  });
  box.addEventListener("picpeak:feedback", function (event) {
    if (event.detail.id === photoId) load();
  });
  toggle.addEventListener("click", function () {
    const open = panel.hidden;
    panel.hidden = !open;
    toggle.setAttribute("aria-expanded", open ? "true" : "false");
    box.classList.toggle("lb-feedback-open", open);
  });
  likeButton.addEventListener("click", function () {
    send("like", likeButton.getAttribute("aria-pressed") === "true" ? "DELETE" : "PUT");
  });
  panel.querySelectorAll('input[name="fb-stars"]').forEach(function (input) {
    input.addEventListener("change", function () { send("rating", "PUT", {stars: Number(input.value)}); });
  });
  form.addEventListener("submit", function (event) {
    event.preventDefault();
    const body = {text: form.elements.text.value};
    if (!nameField.hidden) body.name = form.elements.name.value;
    send("comments", "POST", body).then(function (data) {
      if (!data) return;
      form.elements.text.value = "";
      status.textContent = data.message || msg.msgSent;
    });
  });
  // Keys typed into the form are the guest's, not the lightbox's (arrows, Escape stay for the dialog).
  form.addEventListener("keydown", function (event) {
    if (event.key !== "Escape") event.stopPropagation();
  });
})();
