"""Check the built course website, statically and in headless Chromium (Debian's `chromium` package).

    python site/check.py [--out site/_build/html] [--build] [--screenshots site/_screenshots]

Fails (exit 1, one line per problem) on:
- a broken internal link: an href/src that names a missing file, or a missing #anchor in a site page;
- a page that loads a script, style sheet or image from the network (math must render offline);
- a missing figure: a notebook page with fewer images than its notebook has image outputs, or an
  image file that is missing, empty or not an image;
- raw, unrendered LaTeX in what the browser shows (`$$`, `\\frac`, `\\(`...), a MathJax error, or math
  left unprocessed (after MathJax ran in Chromium, outside code and scripts);
- a console message from the page (uncaught exceptions, console.error/log), except the theme's own
  informational lines in BENIGN_CONSOLE.

No DevTools protocol: Chromium runs with --dump-dom (the DOM after scripts ran, within a virtual time
budget) and --enable-logging=stderr (console messages), and --screenshot for the pictures. Network
access is disabled for the browser (--host-resolver-rules), so a page that needs the network fails.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

SITE = Path(__file__).resolve().parent
ROOT = SITE.parent
DEFAULT_OUT = SITE / "_build" / "html"
BENIGN_CONSOLE = (
    "[PST]:",                   # pydata-sphinx-theme's informational lines
    "Got invalid theme mode",   # the theme's first visit without a stored light/dark choice
    # MathJax 2's HTML-CSS output times its web-font loads with an @font-face whose src is about:blank;
    # Chromium refuses that URL and says so (Jupyter's classic notebook shows the same line).
    "Access to font at 'about:blank'",
)
RAW_LATEX = [
    (re.compile(r"\$\$"), "$$"),
    (re.compile(r"\\[\(\)\[\]]"), r"\( \) \[ or \]"),
    (re.compile(r"\\(?:[A-Za-z]{2,}|[,;!])"), r"a \command"),
    (re.compile(r"\$[^$\n]{0,200}?[\\^_{][^$\n]{0,200}?\$"), "$...$ with TeX inside"),
]
SKIP_TAGS = {"script", "style", "pre", "code", "textarea", "math", "kbd", "samp"}
VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
IMAGE_MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"<svg", b"<?xml")


def load_build():
    """site/build.py as a module (loaded by path: `site` and `build` are also names of installed packages)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("course_site_build", SITE / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def chromium() -> str | None:
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome", "chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


class _Page(HTMLParser):
    """Links, ids, images and the visible text outside code, scripts and MathJax's own markup."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[tuple[str, str, str]] = []  # (tag, attribute, value)
        self.ids: set[str] = set()
        self.text: list[str] = []
        self.stack: list[tuple[str, bool]] = []  # (tag, hides its text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        for attr in ("href", "src"):
            if a.get(attr) is not None and tag in ("a", "img", "script", "link", "iframe", "source"):
                rel = (a.get("rel") or "").lower()
                if tag == "link" and not ({"stylesheet", "icon", "preload"} & set(rel.split())) and attr == "href":
                    kind = "link-other"
                else:
                    kind = tag
                self.links.append((kind, attr, a[attr]))
        if tag in VOID_TAGS:
            return
        classes = (a.get("class") or "").split()
        hidden = tag in SKIP_TAGS or any(c.startswith(("MathJax", "MJX", "mjx")) for c in classes) or a.get("aria-hidden") == "true"
        self.stack.append((tag, hidden))

    def handle_endtag(self, tag):
        if tag in VOID_TAGS:
            return
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        if not any(hidden for _, hidden in self.stack):
            self.text.append(data)


def parse(html_text: str) -> _Page:
    page = _Page()
    page.feed(html_text)
    page.close()
    return page


def static_problems(out: Path) -> list[str]:
    """Broken internal links and anchors, network resources, missing or empty images, in every page."""
    problems: list[str] = []
    pages = {p: parse(p.read_text(encoding="utf-8")) for p in sorted(out.rglob("*.html")) if "_static" not in p.parts}
    for path, page in pages.items():
        name = path.relative_to(out).as_posix()
        text = path.read_text(encoding="utf-8")
        if re.search(r"<details>\s*<summary>.*?</summary>\s*</details>", text, flags=re.S):
            problems.append(f"{name}: a <details> block is empty (its answer is rendered outside it)")
        for kind, attr, value in page.links:
            url = urlsplit(value)
            if url.scheme in ("http", "https") or value.startswith("//"):
                if kind in ("img", "script", "link", "iframe", "source"):
                    problems.append(f"{name}: <{kind} {attr}={value!r}> loads from the network")
                continue
            if url.scheme or value.startswith(("mailto:", "javascript:", "data:")):
                continue
            target = path if not url.path else (path.parent / unquote(url.path)).resolve()
            if url.path and not target.exists():
                problems.append(f"{name}: broken link <{kind} {attr}={value!r}> (no {target.relative_to(out.resolve()) if target.is_relative_to(out.resolve()) else target})")
                continue
            if url.fragment and target.suffix == ".html" and target.resolve() in {p.resolve() for p in pages}:
                ids = pages[next(p for p in pages if p.resolve() == target.resolve())].ids
                if unquote(url.fragment) not in ids:
                    problems.append(f"{name}: broken anchor {value!r}")
            if kind == "img" and url.path:
                head = target.read_bytes()[:16] if target.is_file() else b""
                if not head.lstrip().startswith(IMAGE_MAGIC):
                    problems.append(f"{name}: image {value!r} is empty or not an image")
    return problems


def figure_problems(out: Path, root: Path = ROOT) -> list[str]:
    """Every image output of a notebook appears as an <img> on its page."""
    import nbformat

    problems = []
    for folder in ("notebooks", "exercises"):
        for nb_path in sorted((root / folder).glob("[0-9][0-9]_*.ipynb")):
            nb = nbformat.read(nb_path, as_version=4)
            want = sum(1 for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                       if any(k.startswith("image/") for k in o.get("data", {})))
            page = out / folder / (nb_path.stem + ".html")
            if not page.exists():
                problems.append(f"{folder}/{nb_path.name}: no page {page.relative_to(out)}")
                continue
            html_text = page.read_text(encoding="utf-8")
            got = len(re.findall(r"<img[^>]+src=\"[^\"]*_images/", html_text))
            if got < want:
                problems.append(f"{folder}/{page.name}: {got} figures on the page, the notebook has {want}")
    return problems


def _shrink_png(path: Path) -> None:
    """A 256-colour palette keeps a page screenshot legible and small enough to commit (Pillow, when present)."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


class _Handler(SimpleHTTPRequestHandler):
    """Serves the built site; `?focus=ID` adds a style that folds the page's sections before section ID.

    Headless Chromium paints nothing when a screenshot's URL scrolls to an #anchor, so the lesson's
    screenshot shows the real page with the sections above the chosen one folded away (title, link bar,
    navigation and the section itself are the page's own).
    """

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        focus = parse_qs(url.query).get("focus", [None])[0]
        if not focus or not url.path.endswith(".html"):
            return super().do_GET()
        path = Path(self.translate_path(url.path))
        ident = re.sub(r"[^A-Za-z0-9_-]", "", focus)
        style = (f"<style>article section > :not(h1):not(.course-links):has(~ section#{ident}) "
                 "{ display: none !important; }</style>")
        body = path.read_text(encoding="utf-8").replace("</head>", style + "</head>", 1).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextmanager
def serve(out: Path):
    """The site over HTTP on a free loopback port, as a reader's browser gets it; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Handler, directory=str(out)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def run_chromium(url: str, *, screenshot: Path | None = None, window: tuple[int, int] = (1280, 1400),
                 budget_ms: int = 5000, timeout: float = 120) -> tuple[str, list[str]]:
    """(DOM after scripts ran, console messages) of one page; with `screenshot`, also a PNG of the viewport."""
    exe = chromium()
    if exe is None:
        raise RuntimeError("chromium is not installed (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="course-chromium-") as profile:
        # No network: every host name fails to resolve except the loopback server's address.
        base = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--mute-audio",
                "--no-first-run", "--disable-extensions", "--disable-background-networking", f"--user-data-dir={profile}",
                "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1", f"--window-size={window[0]},{window[1]}",
                f"--virtual-time-budget={budget_ms}", "--enable-logging=stderr", "--v=0"]
        env = {**os.environ, "DBUS_SESSION_BUS_ADDRESS": "disabled:"}
        result = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=timeout, env=env)
        console = [m.group(1) for m in re.finditer(r":CONSOLE[^\]]*\] (.*)$", result.stderr, flags=re.M)]
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run([*base, f"--screenshot={screenshot}", url], capture_output=True, text=True, timeout=timeout,
                           env=env, check=True)
            _shrink_png(screenshot)
    if result.returncode != 0 or not result.stdout.strip():
        raise RuntimeError(f"chromium failed on {url}: exit {result.returncode}\n{result.stderr[-2000:]}")
    return result.stdout, console


def dom_problems(name: str, static_html: str, dom: str, console: list[str]) -> list[str]:
    """Raw LaTeX, MathJax errors, unprocessed math and console messages of one page."""
    problems = [f"{name}: console: {line}" for line in console if not any(b in line for b in BENIGN_CONSOLE)]
    text = " ".join(parse(dom).text)
    for pattern, what in RAW_LATEX:
        m = pattern.search(text)
        if m:
            context = text[max(0, m.start() - 60): m.end() + 60].replace("\n", " ")
            problems.append(f"{name}: raw LaTeX ({what}) visible: ...{context}...")
    if 'class="MathJax_Error"' in dom or "Math Processing Error" in dom:
        problems.append(f"{name}: MathJax reported an error")
    n_math = len(re.findall(r'class="math notranslate', static_html))
    n_done = len(re.findall(r'id="MathJax-Element-\d+-Frame"', dom))
    if n_math and n_done < n_math:
        problems.append(f"{name}: {n_done} of {n_math} math elements rendered by MathJax")
    return problems


def figure_and_math_anchor(html_text: str) -> str | None:
    """The id of the section whose first figure, preceded by display math, comes soonest after its heading."""
    starts = [(m.start(), m.group(1)) for m in re.finditer(r'<section id="([^"]+)"', html_text)] + [(len(html_text), None)]
    best: tuple[int, str] | None = None
    for (start, ident), (end, _) in zip(starts, starts[1:]):
        segment = html_text[start:end]
        math = segment.find('<div class="math notranslate')
        image = segment.find("<img", math if math >= 0 else len(segment))
        if math >= 0 and image >= 0 and (best is None or image < best[0]):
            best = (image, ident)
    return best[1] if best else None


def browser_problems(out: Path, pages: list[str] | None = None, screenshots: Path | None = None,
                     lesson: str = "notebooks/11_ddpm_ddim.html", workers: int = 2) -> list[str]:
    """Open pages in Chromium; screenshots of the front page and of `lesson` at a section with math and a figure."""
    if pages is None:
        pages = sorted(p.relative_to(out).as_posix() for folder in ("notebooks", "exercises") for p in (out / folder).glob("*.html"))
        pages = ["index.html", *pages]
    shots: dict[str, tuple[Path, str, tuple[int, int]]] = {}
    if screenshots is not None:
        shots["index.html"] = (screenshots / "front_page.png", "", (1280, 1400))
        if not (out / lesson).exists():
            return [f"{lesson}: no such page for the lesson screenshot"]
        anchor = figure_and_math_anchor((out / lesson).read_text(encoding="utf-8"))
        if anchor is None:
            return [f"{lesson}: no section with both display math and a figure"]
        shots[lesson] = (screenshots / (Path(lesson).stem + ".png"), "?focus=" + anchor, (1280, 2400))
        pages = list(dict.fromkeys([*pages, *shots]))

    with serve(out) as base:
        def one(name: str) -> list[str]:
            shot, query, window = shots.get(name, (None, "", (1280, 1400)))
            dom, console = run_chromium(base + name)
            problems = dom_problems(name, (out / name).read_text(encoding="utf-8"), dom, console)
            if shot is not None:
                run_chromium(base + name + query, screenshot=shot, window=window)
            return problems

        with ThreadPoolExecutor(max_workers=workers) as pool:
            return [p for problems in pool.map(one, pages) for p in problems]


def check(out: Path = DEFAULT_OUT, screenshots: Path | None = None, pages: list[str] | None = None) -> list[str]:
    out = Path(out).resolve()
    return static_problems(out) + figure_problems(out) + browser_problems(out, pages, screenshots)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the built site")
    parser.add_argument("--build", action="store_true", help="build the site first (site/build.py)")
    parser.add_argument("--screenshots", type=Path, help="folder for front_page.png and the lesson's screenshot")
    parser.add_argument("--pages", nargs="*", help="pages to open (default: the front page and every notebook page)")
    args = parser.parse_args(argv)
    if args.build:
        load_build().build(args.out)
    problems = check(args.out, args.screenshots, args.pages)
    for line in problems:
        print(line)
    print(f"{len(problems)} problems" if problems else "site check passed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
