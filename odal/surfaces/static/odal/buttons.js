// odal's buttons: the copy button of a secret shown once (templates/admin/secret_once.html). A
// file of its own, not an inline script: a Content-Security-Policy may forbid inline scripts.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  for (const field of document.querySelectorAll("input[data-select-on-focus]")) {
    field.addEventListener("focus", () => field.select());
  }
  for (const button of document.querySelectorAll("button[data-copy]")) {
    const field = document.getElementById(button.dataset.copy);
    const said = document.getElementById(button.dataset.copyStatus);
    button.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(field.value);
        said.textContent = "Copied.";
      } catch (refused) {
        // No clipboard API (a page served over plain HTTP) or no permission: the old way.
        field.focus();
        field.select();
        said.textContent = document.execCommand("copy")
          ? "Copied."
          : "Not copied: the secret is selected, press Ctrl+C (⌘C on a Mac).";
      }
    });
  }
});
