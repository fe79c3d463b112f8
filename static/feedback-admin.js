// The photographer's feedback section (templates/admin/_feedback.html): follows the admin's gallery feed and
// says at once, in a polite live region, who commented on which photo (or that likes and ratings changed), with
// a link that reloads the section. The approve / reject buttons are plain form posts. Needs live.js.
"use strict";

(function () {
  const section = document.getElementById("feedback");
  const notice = document.getElementById("feedback-live");
  if (!section || !notice || !window.PicpeakLive) return;
  const link = notice.querySelector("a");
  const said = document.createElement("span");
  notice.insertBefore(said, link);

  window.PicpeakLive.watchGallery({
    wsPath: section.dataset.wsPath,
    onFeedback: function (msg) {
      // Text only (textContent): a guest wrote it.
      const c = msg.comment;
      said.textContent = c && c.status === "held"
        ? " " + c.name + " (" + (msg.filename || "") + "): " + c.text + " "
        : " " + section.dataset.msgCounts.replace("{file}", msg.filename || "")
          .replace("{likes}", String(msg.likes)).replace("{ratings}", String(msg.ratings)) + " ";
      if (link) link.hidden = false;
      notice.hidden = false;
    },
  });
})();
