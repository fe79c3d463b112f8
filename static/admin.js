// Small progressive enhancements for the admin pages. Everything works without this file.
"use strict";

document.addEventListener("click", async (event) => {
  const button = event.target.closest("button.copy[data-copy]");
  if (!button) return;
  try {
    await navigator.clipboard.writeText(button.dataset.copy);
    const label = button.textContent;
    button.textContent = "Copied";
    setTimeout(() => { button.textContent = label; }, 1500);
  } catch {
    const input = document.getElementById("share-link");
    if (input) input.select();
  }
});
