"""The web console in a real browser: Debian's chromium driven by Playwright for Python.

Run by tests/console.rs against a daemon it started on 127.0.0.1, as
    python3 console_browser.py URL DEVICE_DIR MOUNT_DIR [SCREENSHOT_DIR]
with an administrator 'boss' (password 'the boss password') already made.

It does what a new administrator does: logs in (after a wrong password), builds a RAID-Z2
pool of the file devices in DEVICE_DIR through the wizard (after reading the layout's
figures), creates a dataset, a snapshot and a share, writes a file and rolls it away,
adds a user, watches a scrub's progress bar move, then logs in as that user and meets the
server's refusals. Any browser console error or CSP violation fails the run, but for the
HTTP refusals a step expects. Prints one line per step; exits non-zero on the first
failure.
"""

import json
import os
import re
import sys
import time

from playwright.sync_api import sync_playwright, expect

URL, DEVDIR, MNTDIR = sys.argv[1], sys.argv[2], sys.argv[3]
SHOTS = sys.argv[4] if len(sys.argv) > 4 else None
ADMIN, ADMIN_PW = "boss", "the boss password"
USER, USER_PW = "bob", "bob's password 42"

problems = []
# While set, a console error that is the browser's note of an HTTP refusal is expected.
expect_refusals = [False]
REFUSAL = re.compile(r"Failed to load resource: the server responded with a status of (400|401|403|409|429)")


def step(msg):
    print("ok:", msg, flush=True)


def on_console(m):
    if m.type != "error":
        return
    if expect_refusals[0] and REFUSAL.search(m.text):
        return
    problems.append(f"console error: {m.text}")


def shot(page, name):
    if SHOTS:
        page.screenshot(path=os.path.join(SHOTS, name + ".png"), full_page=True)


def check_problems(where):
    if problems:
        raise SystemExit(f"browser problems at '{where}': " + "; ".join(problems))


def done_or_error(page, success):
    """Waits for `success` (a locator) or a refusal on the page; a refusal fails the run
    with the server's words."""
    err = page.locator("main .error")
    deadline = time.time() + 30
    while time.time() < deadline:
        if success.count() > 0:
            return
        if err.count() > 0:
            raise SystemExit("the page shows an error: " + " / ".join(err.all_inner_texts()))
        time.sleep(0.1)
    raise SystemExit("neither the result nor an error appeared; the page at " + page.url + " shows: "
                     + page.locator("main").inner_text()[:1500])


def login(page, user, pw):
    page.goto(URL + "/")
    expect(page).to_have_url(re.compile(r"/login$"))
    page.fill("#user", user)
    page.fill("#password", pw)
    page.click("form#login button[type=submit]")
    expect(page.locator("main h1")).to_have_text("Dashboard", timeout=20000)


def main():
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium",
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )
        # The daemon's certificate is its own self-signed one.
        ctx = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 900})
        ctx.set_default_timeout(20000)
        page = ctx.new_page()
        page.on("console", on_console)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        # A dialog opening means a script ran that should not have (the console itself
        # uses <dialog> elements, which are not these).
        page.on("dialog", lambda d: (problems.append(f"a JavaScript dialog opened: {d.message}"), d.dismiss()))
        # CSP violations are reported to the page as events too.
        page.add_init_script(
            "document.addEventListener('securitypolicyviolation', e => "
            "console.error('CSP violation: ' + e.violatedDirective + ' ' + e.blockedURI));")

        # ---- The headers of the pages.
        r = page.goto(URL + "/login")
        csp = r.headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp, csp
        step("the login page carries a strict Content-Security-Policy: " + csp)

        # ---- Log in: a wrong password first.
        expect_refusals[0] = True
        page.goto(URL + "/")
        expect(page).to_have_url(re.compile(r"/login$"))
        page.fill("#user", ADMIN)
        page.fill("#password", "not the password")
        page.click("form#login button[type=submit]")
        expect(page.locator("#error")).to_contain_text("wrong user name or password")
        expect_refusals[0] = False
        step("a wrong password is refused on the page: " + page.locator("#error").inner_text())
        cookies = {c["name"]: c for c in ctx.cookies()}
        assert "tank_session" not in cookies, cookies
        login(page, ADMIN, ADMIN_PW)
        c = {c["name"]: c for c in ctx.cookies()}["tank_session"]
        assert c["httpOnly"] and c["secure"] and c["sameSite"] == "Strict", c
        step("logged in as the administrator; the session cookie is HttpOnly, Secure, SameSite=Strict")
        check_problems("login")

        # ---- A pool through the wizard.
        page.goto(URL + "/#/pools")
        expect(page.locator("main h1")).to_have_text("Pools")
        page.fill("input[name=name]", "vault")
        page.fill("#dev-dir", DEVDIR)
        page.click("text=List devices")
        boxes = page.locator(f"input[type=checkbox][aria-label^='use {DEVDIR}/']")
        expect(boxes).to_have_count(4)
        for i in range(4):
            boxes.nth(i).check()
        page.select_option("select[name=layout]", "raidz2")
        plan = page.locator("#plan")
        expect(plan.locator("h3")).to_have_text("1 x raidz2 of 4")
        expect(plan).to_contain_text("Usable capacity")
        expect(plan).to_contain_text("Mean time to data loss")
        plan_text = " | ".join(plan.locator("tr").all_inner_texts()[:3]).replace("\t", " ")
        step("the wizard shows the layout's figures before the pool is made: " + plan_text)
        shot(page, "pool-wizard")
        page.click("form button:has-text('Create pool')")
        done_or_error(page, page.locator("main h1", has_text="Pool vault"))
        expect(page.locator("main h1")).to_contain_text("Pool vault", timeout=60000)
        expect(page.locator("main")).to_contain_text("raidz2-0")
        step("pool 'vault' created through the wizard, raidz2 of the 4 devices")
        # The capacity the wizard promised is what the pool reports.
        promised = re.search(r"Usable capacity\s+(\S+)", plan_text).group(1)
        page.goto(URL + "/#/dashboard")
        card = page.locator("main section", has=page.locator("h2", has_text="vault"))
        expect(card.locator(".stat", has_text="Usable for data").locator("b")).to_have_text(promised)
        step(f"the dashboard's usable space of vault is the wizard's {promised}")
        page.goto(URL + "/#/pools/vault")
        expect(page.locator("main h1")).to_contain_text("Pool vault")
        check_problems("pool")

        # ---- A device offline: the pool is DEGRADED, and every page says so; online again.
        expect(page.locator("#banner")).to_be_hidden()
        page.click("button[aria-label='Offline " + DEVDIR + "/d1']")
        page.locator("dialog[open] button.primary").click()
        banner = page.locator("#banner")
        expect(banner).to_contain_text("Pool vault is DEGRADED")
        page.goto(URL + "/#/dashboard")
        expect(page.locator("section.card.bad h2", has_text="vault")).to_be_visible()
        step("a device taken offline through the console: the red banner says '" + banner.inner_text().strip() + "'")
        shot(page, "degraded")
        page.goto(URL + "/#/pools/vault")
        page.click("button[aria-label='Online " + DEVDIR + "/d1']")
        expect(page.locator("button[aria-label='Offline " + DEVDIR + "/d1']")).to_be_visible()
        page.goto(URL + "/#/dashboard")
        expect(page.locator("section.card h2", has_text="vault")).to_contain_text("ONLINE", timeout=30000)
        expect(banner).to_be_hidden(timeout=30000)
        step("online again: the pool is ONLINE and the banner gone")
        check_problems("degraded")

        # ---- A dataset; a name with markup is refused and shown as text.
        page.goto(URL + "/#/datasets")
        expect(page.locator("main h1")).to_have_text("Datasets")
        expect_refusals[0] = True
        page.fill("form input[name=name]", "vault/<img src=x onerror=alert(1)>")
        page.click("button:has-text('Create')")
        err = page.locator("main .error")
        expect(err).to_contain_text("<img src=x onerror=alert(1)>")
        expect_refusals[0] = False
        assert page.locator("main img").count() == 0
        step("a dataset name with markup is refused, and the refusal shows it as text: " + err.inner_text())
        page.fill("form input[name=name]", "vault/docs")
        page.fill("form input[name=mountpoint]", MNTDIR + "/docs")
        page.click("button:has-text('Create')")
        expect(page.locator("main h1")).to_have_text("vault/docs")
        step("dataset vault/docs created")
        mountpoint = page.locator("tr:has(td:text-is('mountpoint')) td").nth(1).get_attribute("title")
        deadline = time.time() + 30
        while not os.path.ismount(mountpoint) and time.time() < deadline:
            time.sleep(0.2)
        assert os.path.ismount(mountpoint), f"{mountpoint} is not mounted"

        # ---- A snapshot, a change, and a rollback.
        with open(os.path.join(mountpoint, "before.txt"), "w") as f:
            f.write("written before @one\n")
            f.flush()
            os.fsync(f.fileno())
        page.fill("#snap-name", "one")
        page.click("button:has-text('Take snapshot')")
        expect(page.locator("main td.mono", has_text="@one")).to_be_visible()
        step("snapshot vault/docs@one taken")
        with open(os.path.join(mountpoint, "after.txt"), "w") as f:
            f.write("written after @one\n")
            f.flush()
            os.fsync(f.fileno())
        page.click("button[aria-label='Roll back to vault/docs@one']")
        dlg = page.locator("dialog[open]")
        expect(dlg).to_contain_text("Every change made to vault/docs since @one is lost")
        confirm = dlg.locator("button.primary")
        expect(confirm).to_be_disabled()
        dlg.locator("input").fill("one")
        expect(confirm).to_be_enabled()
        confirm.click()
        expect(page.locator("dialog[open]")).to_have_count(0)
        deadline = time.time() + 20
        while os.path.exists(os.path.join(mountpoint, "after.txt")) and time.time() < deadline:
            time.sleep(0.2)
        assert not os.path.exists(os.path.join(mountpoint, "after.txt")), "the rollback left after.txt"
        step("rolled back to @one after typing its name: after.txt is gone from " + mountpoint)
        page.click("main a:has-text('Browse')")
        expect(page.locator("main h1")).to_have_text("vault/docs@one:/")
        expect(page.locator("main td", has_text="before.txt")).to_be_visible()
        step("the snapshot's files are browsed: " + " ".join(page.locator("main tbody tr").all_inner_texts()).replace("\t", " "))
        page.goto(URL + "/#/datasets/vault/docs")
        page.fill("input[name=hourly]", "3")
        page.fill("input[name=daily]", "7")
        page.click("button:has-text('Save schedule')")
        done_or_error(page, page.locator("main p", has_text="Kept now:"))
        step("a snapshot schedule is set: " + page.locator("main p", has_text="Kept now:").inner_text())
        shot(page, "dataset")
        check_problems("dataset")

        # ---- A share.
        page.goto(URL + "/#/shares")
        expect(page.locator("main h1")).to_have_text("Shares")
        page.select_option("select[name=protocol]", "smb")
        page.fill("input[name=name]", "docs")
        page.select_option("select[name=dataset]", "vault/docs")
        page.check("input[name=opt_timemachine]")
        page.fill("input[name=opt_timemachine_quota]", "2G")
        page.click("button:has-text('Add share')")
        row = page.locator("main tr", has_text="vault/docs")
        done_or_error(page, row)
        expect(row).to_contain_text("timemachine=on")
        expect(row).to_contain_text("timemachine_quota=2147483648")
        step("SMB share 'docs' of vault/docs added with Time Machine through its wizard: " + row.inner_text().replace("\t", " | "))
        # An NFS export of the same filesystem: hosts, not accounts, so no user's share.
        page.select_option("select[name=protocol]", "nfs")
        page.fill("input[name=name]", "docs-nfs")
        page.select_option("select[name=dataset]", "vault/docs")
        page.fill("input[name=opt_clients]", "127.0.0.1")
        page.click("button:has-text('Add share')")
        done_or_error(page, page.locator("main tr", has_text="docs-nfs"))
        step("NFS export 'docs-nfs' of vault/docs added for 127.0.0.1")
        check_problems("share")

        # ---- A user.
        page.goto(URL + "/#/users")
        expect(page.locator("main h1")).to_have_text("Users")
        page.fill("input[name=name]", USER)
        page.fill("input[name=password]", USER_PW)
        page.click("button:has-text('Add user')")
        done_or_error(page, page.locator("main tr", has_text=USER))
        expect(page.locator("main tr", has_text=USER)).to_contain_text("user")
        step(f"user '{USER}' added")
        shot(page, "users")

        # ---- A scrub's progress bar moves (the scrub is held to a rate so it can be seen).
        with open(os.path.join(mountpoint, "data.bin"), "wb") as f:
            for _ in range(48):
                f.write(os.urandom(1 << 20))
            os.fsync(f.fileno())
        page.goto(URL + "/#/datasets/vault/docs")
        page.fill("#snap-name", "two")
        page.click("button:has-text('Take snapshot')")
        expect(page.locator("main td.mono", has_text="@two")).to_be_visible()
        page.goto(URL + "/#/pools/vault")
        page.click("button:has-text('Start scrub')")
        bar = page.locator("progress.scan-progress")
        expect(bar).to_be_visible()
        first = float(bar.get_attribute("value"))
        moved = None
        deadline = time.time() + 30
        while time.time() < deadline:
            time.sleep(0.5)
            if page.locator("progress.scan-progress").count() == 0:
                break
            v = float(page.locator("progress.scan-progress").get_attribute("value"))
            if v > first:
                moved = v
                shot(page, "scrub")
                break
        assert moved is not None, f"the scrub's bar did not move from {first}"
        step(f"the scrub's progress bar moved without a reload: {first}% -> {moved}% "
             + page.locator(".scan p").inner_text())
        expect(page.locator(".scan")).to_contain_text("Last scrub", timeout=60000)
        step("the scrub finished: " + page.locator(".scan").inner_text().replace("\n", " "))
        page.goto(URL + "/#/dashboard")
        expect(page.locator("main h2", has_text="vault")).to_be_visible()
        page.wait_for_timeout(2500)
        shot(page, "dashboard")
        check_problems("scrub")

        # ---- The planner, and one of its layouts measured as an emulated build, as a job.
        page.goto(URL + "/#/tools")
        page.fill("input[name=disks]", "4")
        page.locator("input[name=size]").first.fill("64G")
        page.select_option("select[name=type]", "ssd")
        page.click("button:has-text('Rank layouts')")
        layout = page.locator("main tr", has_text="raidz1 of 4").first
        expect(layout).to_be_visible()
        step("the planner ranks layouts for 4 SSDs of 64G: " + layout.inner_text().replace("\t", " | "))
        layout.locator("button:has-text('Measure')").click()
        build = page.locator("input[name=build]")
        expect(build).to_be_visible()
        expect(page.locator("select[name=dataset]")).to_be_hidden()
        spec = build.input_value()
        assert spec.startswith("4x ssd") and "raidz1" in spec, spec
        page.locator("input[name=size]").last.fill("128M")
        page.fill("input[name=runs]", "1")
        page.fill("input[name=files]", "300")
        page.fill("input[name=tree_files]", "60")
        page.click("button:has-text('Run benchmark')")
        bar = page.locator("progress.job-progress")
        expect(bar).to_be_visible()
        step(f"the emulated build '{spec}' is measured by the daemon as a job with a progress bar: "
             + page.locator("main tr", has=bar).inner_text().replace("\t", " | "))
        expect(bar).to_have_count(0, timeout=120000)
        row = page.locator("main tr", has_text="emulated " + spec).first
        expect(row).to_contain_text("finished")
        history = page.locator("main td", has_text="emulated " + spec)
        expect(history.first).to_be_visible()
        step("the job finished and its run is in the history: " + row.inner_text().replace("\t", " | "))
        shot(page, "bench")
        check_problems("bench")

        # ---- Log out; log in as the user; the server refuses what the user may not do.
        page.click("#logout")
        expect(page).to_have_url(re.compile(r"/login\?why=out$"))
        expect(page.locator("#reason")).to_contain_text("logged out")
        # The keyboard alone: the user field has the focus; Tab to the password; Enter.
        page.goto(URL + "/")
        expect(page).to_have_url(re.compile(r"/login$"))
        page.keyboard.type(USER)
        page.keyboard.press("Tab")
        page.keyboard.type(USER_PW)
        page.keyboard.press("Enter")
        expect(page.locator("main h1")).to_have_text("Dashboard", timeout=20000)
        step("bob logged in with the keyboard alone")
        nav = page.locator("nav").inner_text()
        assert "Pools" not in nav and "Users" not in nav, nav
        expect(page.locator("main h2", has_text="vault")).to_be_visible()
        step("logged in as bob: the dashboard shows the pools' health; the nav offers no admin pages: " + nav.replace("\n", " "))
        expect_refusals[0] = True
        page.goto(URL + "/#/users")
        expect(page.locator("main .error")).to_contain_text("not an administrator")
        step("the users page, opened by its address, is refused by the server: " + page.locator("main .error").inner_text())
        answers = page.evaluate("""async () => {
            const csrf = document.querySelector('meta[name="csrf-token"]').content;
            const call = async (op, body, headers) => {
                const r = await fetch('/api/v1/' + op, {method: 'POST', credentials: 'same-origin',
                    headers: Object.assign({'Content-Type': 'application/json'}, headers), body: JSON.stringify(body)});
                return [r.status, await r.text()];
            };
            return {
                scrub: await call('pool_scrub', {name: 'vault', action: 'start'}, {'X-CSRF-Token': csrf}),
                destroy: await call('dataset_destroy', {name: 'vault/docs'}, {'X-CSRF-Token': csrf}),
                passwd_other: await call('user_passwd', {name: 'boss', password: 'taken over!'}, {'X-CSRF-Token': csrf}),
                no_csrf: await call('token_add', {user: 'bob'}, {}),
            };
        }""")
        expect_refusals[0] = False
        for k, (status, body) in answers.items():
            assert status == 403, (k, status, body)
        step("as bob, the API refuses a scrub, a destroy, another's password and a change without the CSRF token: "
             + json.dumps({k: json.loads(v[1])["error"]["message"] for k, v in answers.items()}))
        # The user's shares: the SMB share open to every account, not the NFS export.
        page.goto(URL + "/#/shares")
        expect(page.locator("main tr", has_text="vault/docs")).to_have_count(1)
        expect(page.locator("main tr", has_text="docs-nfs")).to_have_count(0)
        expect(page.locator("button:has-text('Add share')")).to_have_count(0)
        step("bob's shares page lists the SMB share every account may use, not the NFS export, and offers no wizard")
        page.goto(URL + "/#/account")
        page.click("button:has-text('New API token')")
        secret = page.locator("code.new-secret")
        expect(secret).to_contain_text("tank_")
        step("bob made his own API token; it is shown once")
        page.click("button:has-text('Done')")
        check_problems("user")

        # ---- A phone-sized screen.
        phone = browser.new_context(ignore_https_errors=True, viewport={"width": 390, "height": 844},
                                    storage_state=ctx.storage_state())
        pp = phone.new_page()
        pp.on("console", on_console)
        pp.goto(URL + "/#/dashboard")
        expect(pp.locator("main h1")).to_have_text("Dashboard")
        assert not pp.locator("nav").is_visible()
        pp.click("#menu")
        assert pp.locator("nav").is_visible()
        width = pp.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"the dashboard is {width} px wide on a 390 px screen"
        step(f"on a 390 px screen the menu folds and the page is {width} px wide")
        shot(pp, "phone")
        check_problems("phone")
        browser.close()
    print("all steps passed", flush=True)


if __name__ == "__main__":
    main()
