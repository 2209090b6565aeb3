// The login page: posts the form to the API's login and opens the console.
"use strict";
(function () {
  const form = document.getElementById("login");
  const err = document.getElementById("error");
  const reason = document.getElementById("reason");
  const why = new URLSearchParams(location.search).get("why");
  const reasons = {
    expired: "Your session has ended. Log in again.",
    out: "You have logged out.",
  };
  if (why && reasons[why]) {
    reason.textContent = reasons[why];
    reason.hidden = false;
  }
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    err.hidden = true;
    const user = form.user.value.trim();
    const password = form.password.value;
    if (!user || !password) {
      err.textContent = "Enter your user name and password.";
      err.hidden = false;
      return;
    }
    const button = form.querySelector("button");
    button.disabled = true;
    try {
      const r = await fetch("/api/v1/login", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ user, password }),
        credentials: "same-origin",
      });
      const body = await r.json().catch(() => ({}));
      if (r.ok) {
        location.replace("/");
        return;
      }
      err.textContent = (body.error && body.error.message) || ("The server answered " + r.status + ".");
      err.hidden = false;
      form.password.value = "";
      form.password.focus();
    } catch (e) {
      err.textContent = "The server cannot be reached: " + e.message;
      err.hidden = false;
    } finally {
      button.disabled = false;
    }
  });
})();
