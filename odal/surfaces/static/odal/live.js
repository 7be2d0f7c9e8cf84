/* Live parts of odal's admin pages (odal/surfaces/live.py; docs/admin.md, "Live parts").

   A live page carries its config as JSON (#odal-live): the stamp URL it polls, the stamp it was
   rendered with, and which of Django's own markup is live (readonly fields, inline groups, the
   changelist's table). It polls the stamp (one small query) every few seconds while work is in
   flight, slowly at rest, never while the tab is hidden. When the stamp differs it fetches the
   page again and replaces every element that has [data-live] and an id by the element with the
   same id in the new page. The page is not reloaded: scroll, focus, anything typed and the rows
   ticked in a list stay as they were.

   Also, on every page: a form or link marked data-busy="text" (or a list action named in
   SLOW_ACTIONS) shows a spinner and that text while its page is being made, and cannot
   be sent twice. */
(function () {
  "use strict";

  const configNode = document.getElementById("odal-live");
  const config = configNode ? JSON.parse(configNode.textContent) : {};
  // The list actions whose page is slow to come (it asks the registry first), and what to say.
  const SLOW_ACTIONS = { abandon_selected: "Asking the registry…" };

  /* ---- the busy state of slow actions ---------------------------------------------------- */

  function busyText(form, submitter) {
    if (submitter && submitter.dataset.busy) return submitter.dataset.busy;
    if (form.dataset.busy) return form.dataset.busy;
    // A list's action menu, a reason page's hidden action, or an object page's button (data-action).
    const action = form.querySelector("[name=action]");
    const named = (submitter && submitter.dataset.action) || (action && action.value);
    return SLOW_ACTIONS[named] || "";
  }

  function showBusy(anchor, text) {
    const note = document.createElement("span");
    note.className = "odal-busy";
    note.setAttribute("role", "status");
    const spinner = document.createElement("i");  // (not a span: Django's narrow list bar stretches those)
    spinner.className = "odal-spinner";
    spinner.setAttribute("aria-hidden", "true");
    note.append(spinner, text);
    anchor.after(note);
    return note;
  }

  document.addEventListener("submit", function (event) {
    const form = event.target;
    const text = busyText(form, event.submitter);
    if (!text || event.defaultPrevented) return;  // (another script kept the form from going)
    if (form.dataset.busyNow) {  // sent already: its page is on the way
      event.preventDefault();
      return;
    }
    form.dataset.busyNow = "1";
    const anchor = event.submitter || form.querySelector("[type=submit]") || form.lastElementChild;
    // After the form's data is taken (a disabled button would not send its name and value).
    setTimeout(function () {
      form.querySelectorAll("button, input[type=submit]").forEach(function (b) { b.disabled = true; });
      form.classList.add("odal-is-busy");
      if (anchor) showBusy(anchor, text);
    }, 0);
  });

  document.addEventListener("click", function (event) {
    const link = event.target.closest && event.target.closest("a[data-busy]");
    if (!link) return;
    if (link.dataset.busyNow) {
      event.preventDefault();
      return;
    }
    link.dataset.busyNow = "1";
    link.classList.add("odal-is-busy");
    link.setAttribute("aria-disabled", "true");
    showBusy(link, link.dataset.busy);
  });

  // Back to a page the browser kept (back button): no longer busy.
  window.addEventListener("pageshow", function (event) {
    if (!event.persisted) return;
    document.querySelectorAll(".odal-busy").forEach(function (n) { n.remove(); });
    document.querySelectorAll("[data-busy-now]").forEach(function (el) {
      delete el.dataset.busyNow;
      el.classList.remove("odal-is-busy");
      el.removeAttribute("aria-disabled");
      el.querySelectorAll("button, input[type=submit]").forEach(function (b) { b.disabled = false; });
    });
  });

  if (!config.url) return;

  /* ---- which parts are live -------------------------------------------------------------- */

  // Django's markup made live by the config: a readonly field's value (.field-<name> .readonly),
  // or any element a selector names (an inline group, the changelist's table).
  function markParts(doc) {
    (config.fields || []).forEach(function (name) {
      const value = doc.querySelector(".field-" + name + " .readonly");
      if (value) {
        value.dataset.live = "field";
        value.id = value.id || "live-field-" + name;
      }
    });
    (config.parts || []).forEach(function (selector, i) {
      const part = doc.querySelector(selector);
      if (part) {
        part.dataset.live = part.dataset.live || "part";
        part.id = part.id || "live-part-" + i;
      }
    });
  }

  /* ---- what the person is doing survives a swap ----------------------------------------- */

  const CONTROLS = "input:not([type=hidden]), textarea, select";

  function keyOf(control) {
    if (control.id) return "#" + control.id;
    if (!control.name) return null;
    const choice = control.type === "checkbox" || control.type === "radio";
    return control.name + (choice ? "=" + control.value : "");
  }

  function changedByHand(control) {
    if (control.type === "checkbox" || control.type === "radio") return control.checked !== control.defaultChecked;
    if (control.tagName === "SELECT") {
      return Array.from(control.options).some(function (o) { return o.selected !== o.defaultSelected; });
    }
    return control.value !== control.defaultValue;
  }

  // The controls of `old` the person touched (or is in), to be put back into `fresh`.
  function touched(old) {
    const found = [];
    old.querySelectorAll(CONTROLS).forEach(function (control) {
      const key = keyOf(control);
      if (key && (changedByHand(control) || control === document.activeElement)) found.push([key, control]);
    });
    return found;
  }

  function restore(fresh, controls) {
    let lost = 0, focus = null;
    controls.forEach(function ([key, old]) {
      const match = Array.from(fresh.querySelectorAll(CONTROLS)).find(function (c) { return keyOf(c) === key; });
      if (!match) {
        if (old.type === "checkbox" && old.checked) lost += 1;
        return;
      }
      if (old.type === "checkbox" || old.type === "radio") match.checked = old.checked;
      else if (old.tagName === "SELECT") {
        Array.from(match.options).forEach(function (o, i) { o.selected = !!(old.options[i] && old.options[i].selected); });
      } else match.value = old.value;
      if (old === document.activeElement) focus = [match, old];
    });
    return { lost: lost, focus: focus };
  }

  /* ---- the swap --------------------------------------------------------------------------- */

  let swaps = 0, lostRows = 0;

  function swap(doc) {
    markParts(doc);
    const active = document.activeElement;
    const selection = active && "selectionStart" in active ? [active.selectionStart, active.selectionEnd] : null;
    let listSwapped = false;
    const swapped = [];
    document.querySelectorAll("[data-live][id]").forEach(function (old) {
      const fresh = doc.getElementById(old.id);
      if (!fresh) return;
      const adopted = document.importNode(fresh, true);
      if (adopted.isEqualNode(old)) return;  // (nothing changed in this part)
      const kept = restore(adopted, touched(old));
      lostRows += kept.lost;
      old.replaceWith(adopted);
      swapped.push(old.id);
      if (adopted.querySelector("input.action-select") || adopted.id === "result_list") listSwapped = true;
      if (kept.focus) {
        kept.focus[0].focus({ preventScroll: true });
        if (selection && "setSelectionRange" in kept.focus[0]) {
          try { kept.focus[0].setSelectionRange(selection[0], selection[1]); } catch (e) { /* (not a text box) */ }
        }
      }
    });
    if (listSwapped) rewireList();
    if (swapped.length) {
      swaps += 1;
      document.dispatchEvent(new CustomEvent("odal:live-swapped", { detail: { ids: swapped } }));
    }
    const newConfig = doc.getElementById("odal-live");
    return newConfig ? JSON.parse(newConfig.textContent) : null;
  }

  // Django's actions.js holds the list's checkboxes it found at load: hand it the new ones, and
  // let each ticked row say so again (its highlight, the "n of m selected" counter).
  function rewireList() {
    const boxes = document.querySelectorAll("tr input.action-select");
    if (!window.Actions || !boxes.length || !document.getElementById("action-toggle")) return;
    window.Actions(boxes);
    const ticked = Array.from(boxes).filter(function (b) { return b.checked; });
    ticked.forEach(function (box) { box.dispatchEvent(new Event("change", { bubbles: true })); });
    document.getElementById("action-toggle").checked = ticked.length === boxes.length;
  }

  /* ---- the poll --------------------------------------------------------------------------- */

  let stamp = config.stamp;
  let pollSeconds = config.pollSeconds || config.restSeconds || 30;
  let checkedAt = Date.now();
  let timer = null, inFlight = false, stopped = "", failing = false;

  const line = document.createElement("p");
  line.className = "odal-live";
  line.setAttribute("role", "status");
  line.setAttribute("aria-live", "off");  // (a clock read out every second would be noise)
  const dot = document.createElement("i");
  dot.className = "odal-live-dot";
  dot.setAttribute("aria-hidden", "true");
  const words = document.createElement("span");
  line.append(dot, words);
  const home = document.getElementById("content-main");
  if (home) home.before(line);

  function ago(ms) {
    const s = Math.max(0, Math.round(ms / 1000));
    return s < 90 ? s + " s ago" : Math.round(s / 60) + " min ago";
  }

  function say() {
    line.dataset.swaps = String(swaps);
    line.classList.toggle("busy", !stopped && !failing && pollSeconds <= (config.busySeconds || 3));
    line.classList.toggle("stopped", !!stopped || failing);
    if (stopped) {
      words.textContent = stopped;
      return;
    }
    const when = "updated " + ago(Date.now() - checkedAt);
    let text = failing
      ? "Not " + when + ": the server did not answer; trying again"
      : line.classList.contains("busy")
        ? "Live: " + when + " · checks every " + pollSeconds + " s while work is in flight"
        : when + " · nothing in flight, checks every " + pollSeconds + " s";
    if (lostRows) text += " · " + lostRows + " ticked row" + (lostRows > 1 ? "s" : "") + " left this list";
    words.textContent = text;
  }

  function stop(text) {
    stopped = text;
    clearTimeout(timer);
    say();
  }

  function schedule(seconds) {
    clearTimeout(timer);
    if (stopped || document.hidden) return;
    timer = setTimeout(poll, seconds * 1000);
  }

  async function refetchPage() {
    const response = await fetch(window.location.href, {
      credentials: "same-origin", cache: "no-store", headers: { "X-Odal-Live": "1" },
    });
    if (!response.ok || response.redirected) throw new Error("page " + response.status);
    const doc = new DOMParser().parseFromString(await response.text(), "text/html");
    return swap(doc);
  }

  async function poll() {
    if (inFlight || stopped) return;
    inFlight = true;
    try {
      const response = await fetch(config.url, {
        credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" },
      });
      const json = (response.headers.get("Content-Type") || "").includes("application/json");
      if (response.redirected || (response.ok && !json)) return stop("Signed out: not updating. Reload the page to sign in again.");
      if (response.status === 403) return stop("Not updating: you may no longer view this.");
      if (response.status === 404) return stop("Not updating: this no longer exists.");
      if (!response.ok) throw new Error("stamp " + response.status);
      const answer = await response.json();
      if (answer.stamp !== stamp) {
        const fresh = await refetchPage();
        // The page's own stamp (read before its parts were), else the poll's.
        stamp = fresh && fresh.stamp ? fresh.stamp : answer.stamp;
      }
      pollSeconds = answer.pollSeconds || pollSeconds;
      checkedAt = Date.now();
      failing = false;
    } catch (error) {
      failing = true;
    } finally {
      inFlight = false;
      say();
      schedule(failing ? Math.max(pollSeconds, 10) : pollSeconds);
    }
  }

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) clearTimeout(timer);
    else if (Date.now() - checkedAt > pollSeconds * 1000) poll();  // back: at once, if it is time
    else schedule(pollSeconds - (Date.now() - checkedAt) / 1000);
  });

  markParts(document);
  say();
  setInterval(function () { if (!document.hidden) say(); }, 1000);
  schedule(pollSeconds);
})();
