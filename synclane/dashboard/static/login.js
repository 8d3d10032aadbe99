"use strict";
// Sends the secret once; the answer sets an HttpOnly session cookie and the page opens.
(() => {
  const input = document.getElementById("secret");
  const button = document.getElementById("login");
  const notice = document.getElementById("notice");

  async function login() {
    button.disabled = true;
    try {
      const response = await fetch("api/login", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ secret: input.value }),
        credentials: "same-origin",
        cache: "no-store",
      });
      const answer = await response.json().catch(() => ({}));
      if (!response.ok) throw new Error(answer.error || "HTTP " + response.status);
      window.location.assign("./");
    } catch (error) {
      notice.textContent = error.message;
      notice.hidden = false;
    } finally {
      button.disabled = false;
    }
  }

  button.addEventListener("click", login);
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") login();
  });
})();
