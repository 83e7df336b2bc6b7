// The reviewer console's one script: WebAuthn ceremonies for enrolment,
// sign-in and each decision. No inline script; served from 'self'.
"use strict";
(function () {
  const csrf = document.querySelector('meta[name="csrf-token"]').getAttribute("content");
  const base = document.querySelector('meta[name="console-base"]').getAttribute("content");
  const status = document.getElementById("status");
  function say(msg) { if (status) { status.textContent = msg; } }
  function b64u(buf) {
    const b = new Uint8Array(buf); let s = "";
    for (let i = 0; i < b.length; i++) { s += String.fromCharCode(b[i]); }
    return btoa(s).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }
  function unb64u(s) {
    s = s.replace(/-/g, "+").replace(/_/g, "/"); while (s.length % 4) { s += "="; }
    const bin = atob(s); const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) { out[i] = bin.charCodeAt(i); }
    return out.buffer;
  }
  async function post(path, body) {
    const r = await fetch(base + path, { method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf }, body: JSON.stringify(body || {}) });
    const j = await r.json().catch(() => ({ error: "the server answered " + r.status }));
    if (!r.ok) { throw new Error(j.error || ("the server answered " + r.status)); }
    return j;
  }
  function requestOptions(o) {
    o.challenge = unb64u(o.challenge);
    (o.allowCredentials || []).forEach(function (c) { c.id = unb64u(c.id); });
    return o;
  }
  function assertionJSON(c) {
    return { id: c.id, rawId: b64u(c.rawId), type: c.type, response: {
      clientDataJSON: b64u(c.response.clientDataJSON), authenticatorData: b64u(c.response.authenticatorData),
      signature: b64u(c.response.signature), userHandle: c.response.userHandle ? b64u(c.response.userHandle) : undefined } };
  }
  // Times: the server writes each one's age and UTC instant; here they
  // read in the reviewer's local time, the UTC instant on hover (title).
  function plural(n, one, many) { return n === 1 ? "1 " + one : n + " " + many; }
  function age(at, now) {
    let d = now - at; const future = d < 0; if (future) { d = -d; }
    const min = 60000, hour = 60 * min;
    let s;
    if (d < min) { return "just now"; }
    if (d < hour) { s = plural(Math.floor(d / min), "minute", "minutes"); }
    else if (d < 48 * hour) { s = plural(Math.floor(d / hour), "hour", "hours"); }
    else { s = plural(Math.floor(d / (24 * hour)), "day", "days"); }
    return future ? "in " + s : s + " ago";
  }
  function two(n) { return (n < 10 ? "0" : "") + n; }
  function local(at, now) {
    const hm = two(at.getHours()) + ":" + two(at.getMinutes());
    if (at.toDateString() === now.toDateString()) { return hm; }
    return at.getFullYear() + "-" + two(at.getMonth() + 1) + "-" + two(at.getDate()) + " " + hm;
  }
  function localise(root) {
    const now = new Date();
    root.querySelectorAll("time[data-age]").forEach(function (el) {
      const at = new Date(el.getAttribute("datetime"));
      if (isNaN(at.getTime())) { return; }
      el.textContent = age(at, now) + " (" + local(at, now) + ")";
    });
  }
  localise(document);
  window.setInterval(function () { localise(document); }, 30000);
  const signout = document.getElementById("signout");
  if (signout) {
    signout.addEventListener("click", async function () {
      try {
        await post("api/logout");
        window.location.assign(base);
      } catch (e) { say("Sign-out failed: " + e.message); }
    });
  }
  const enrol = document.getElementById("register");
  if (enrol) {
    enrol.addEventListener("click", async function () {
      try {
        const token = enrol.getAttribute("data-token");
        const o = (await post("api/enrol/begin", { token: token })).publicKey;
        o.challenge = unb64u(o.challenge); o.user.id = unb64u(o.user.id);
        (o.excludeCredentials || []).forEach(function (c) { c.id = unb64u(c.id); });
        let c;
        try {
          c = await navigator.credentials.create({ publicKey: o });
        } catch (e) {
          // The browser says as little as it can (NotAllowedError for a
          // cancel, a timeout and an authenticator without any of the
          // algorithms offered alike): name what the server takes.
          throw new Error(e.message + " This server takes passkeys that sign with " + enrol.getAttribute("data-algorithms") +
            "; if your authenticator offers none of them, register on another one.");
        }
        const res = await post("api/enrol/finish", { token: token, credential: { id: c.id, rawId: b64u(c.rawId), type: c.type,
          response: { clientDataJSON: b64u(c.response.clientDataJSON), attestationObject: b64u(c.response.attestationObject) } } });
        say("Registered. Fingerprint " + res.fingerprint + " — tell the operator, who confirms it matches.");
        const fp = document.getElementById("fingerprint"); if (fp) { fp.textContent = res.fingerprint; }
      } catch (e) { say("Registration failed: " + e.message); }
    });
  }
  const signin = document.getElementById("signin");
  if (signin) {
    signin.addEventListener("click", async function () {
      try {
        const o = requestOptions((await post("api/login/begin")).publicKey);
        const c = await navigator.credentials.get({ publicKey: o });
        await post("api/login/finish", { credential: assertionJSON(c) });
        window.location.assign(base);
      } catch (e) { say("Sign-in failed: " + e.message); }
    });
  }
  // The live queue: the server sends the queue's tables, rendered and
  // escaped as the page is, at each change.
  // The seller findings come on the same stream, as "findings" events.
  const queue = document.getElementById("queue");
  if (queue && window.EventSource) {
    const events = new EventSource(queue.getAttribute("data-live"));
    const live = function (kind, el) {
      if (!el) { return; }
      events.addEventListener(kind, function (ev) {
        const doc = new DOMParser().parseFromString("<body>" + ev.data + "</body>", "text/html");
        el.replaceChildren.apply(el, Array.from(doc.body.childNodes));
        localise(el);
      });
    };
    live("queue", queue);
    live("findings", document.getElementById("findings-live"));
  }
  // The mandate's bounds are editable only while it is asked for.
  const mandateOn = document.getElementById("m-on");
  if (mandateOn) {
    const fields = document.querySelectorAll("#mandate .fields input, #mandate .fields select, #mandate .check input");
    const sync = function () { fields.forEach(function (f) { f.disabled = !mandateOn.checked; }); };
    mandateOn.addEventListener("change", sync);
    sync();
  }
  document.querySelectorAll("button[data-decision]").forEach(function (btn) {
    btn.addEventListener("click", async function () {
      const id = btn.getAttribute("data-review");
      const decision = btn.getAttribute("data-decision");
      const note = document.getElementById("note").value;
      const begin = { decision: decision, note: note };
      // The approval's "and allow this payee" part: its bounds go to
      // begin, which answers the grant the passkey then signs with it.
      const on = document.getElementById("m-on");
      if (decision === "approved" && on && on.checked) {
        const host = document.getElementById("m-host");
        begin.mandate = { max_amount: document.getElementById("m-max").value.trim(), budget: document.getElementById("m-budget").value.trim(),
          count: parseInt(document.getElementById("m-count").value || "0", 10) || 0, expires: document.getElementById("m-expires").value,
          host: !!(host && host.checked), agent: document.getElementById("m-agent").checked };
      }
      try {
        const opts = await post("api/reviews/" + id + "/begin", begin);
        const o = requestOptions(opts.publicKey);
        const c = await navigator.credentials.get({ publicKey: o });
        const fin = { decision: decision, note: note, credential: assertionJSON(c) };
        if (opts.grant) { fin.grant = opts.grant; }
        const res = await post("api/reviews/" + id + "/finish", fin);
        say("Review " + id + " " + res.status + " by " + res.decided_by + (res.mandate_id ? ", with mandate " + res.mandate_id : "") + ".");
        window.location.assign(base + "reviews/" + id);
      } catch (e) { say("Decision failed: " + e.message); }
    });
  });
})();
