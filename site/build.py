"""Build the course website from the committed, executed notebooks (nothing is re-executed).

    python site/build.py [--out site/_build/html] [--repository OWNER/NAME] [--strict]

Stages every lesson (notebooks/) and problem set (exercises/) with a generated front page into a
temporary source folder and runs Sphinx + MyST-NB with site/conf.py. The front page is the syllabus:
topics and CPU/GPU needs are read from README.md's syllabus table, run times from
benchmarks/results/notebook_times_cpu.json. Each notebook page gets links to its .ipynb file (shipped
with the site under files/), to Colab, to its source and to its problem set or lesson. Math renders
offline with the MathJax shipped by the pip package jupyter-server-mathjax (copied to _static/mathjax).

Needs the `site` extra (sphinx, myst-nb, sphinx-book-theme, sphinx-copybutton, jupyter-server-mathjax).
The repository named in the Colab and source links comes from --repository, else $COURSE_REPOSITORY,
else $GITHUB_REPOSITORY (set on GitHub's runners), else DEFAULT_REPOSITORY below.
"""
from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

SITE = Path(__file__).resolve().parent
ROOT = SITE.parent
DEFAULT_OUT = SITE / "_build" / "html"
DEFAULT_REPOSITORY = "loops-to-kernels/loops-to-kernels"
TIMES = ROOT / "benchmarks" / "results" / "notebook_times_cpu.json"
sys.path.insert(0, str(ROOT))
from course_utils.topics import TOPICS  # noqa: E402  (the registry of topics; site/ runs from a checkout)
COLAB = "https://colab.research.google.com/github/{repo}/blob/{branch}/{path}"
GITHUB = "https://github.com/{repo}/blob/{branch}/{path}"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_NOTE = ('<div class="widget-note">An interactive widget is here in the notebook: '
               "open the notebook (in Jupyter or Colab) to use it.</div>")


@dataclass
class Topic:
    number: str                  # "03"
    summary: str                 # README's topic column, or the lesson's title
    needs: str = ""              # README's needs column
    lesson: str | None = None    # "notebooks/03_convolution.ipynb" when committed (the first part of a split lesson)
    problems: str | None = None  # "exercises/03_convolution.ipynb" when committed
    title: str = ""              # the lesson's H1 without the number
    parts: list = field(default_factory=list)  # every lesson notebook of the topic: one, or 07a_, 07b_, 07c_

    @property
    def pages(self) -> list[str]:
        return [*self.parts, *([self.problems] if self.problems else [])]


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def readme_syllabus(readme: Path = ROOT / "README.md") -> dict[str, tuple[str, str]]:
    """{number: (topic, needs)} from the table under README's `## Syllabus`."""
    text = readme.read_text(encoding="utf-8")
    match = re.search(r"^## Syllabus\s*$(.*?)(?=^## )", text, flags=re.M | re.S)
    rows: dict[str, tuple[str, str]] = {}
    if not match:
        return rows
    lines = [line for line in match.group(1).splitlines() if line.startswith("|")]
    if not lines:
        return rows
    header = [h.lower() for h in _cells(lines[0])]
    col = {name: next((i for i, h in enumerate(header) if h.startswith(name)), None) for name in ("#", "topic", "needs")}
    for line in lines[2:]:
        cells = _cells(line)
        number = cells[col["#"] or 0]
        if re.fullmatch(r"\d\d", number):
            topic = cells[col["topic"]] if col["topic"] is not None else ""
            needs = cells[col["needs"]] if col["needs"] is not None else ""
            rows[number] = (topic, needs)
    return rows


def recorded_times(path: Path = TIMES) -> tuple[dict[str, float], dict]:
    """{repository path: seconds} and the record's machine description."""
    if not path.exists():
        return {}, {}
    record = json.loads(path.read_text(encoding="utf-8"))
    return {n["notebook"]: float(n["seconds"]) for n in record.get("notebooks", [])}, record.get("recorded_on", {})


def notebook_title(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            m = re.search(r"^#\s+(.+)$", cell.source, flags=re.M)
            if m:
                return m.group(1).strip()
    return path.stem


def topics(root: Path = ROOT) -> list[Topic]:
    """The syllabus: course_utils/topics.py's topics, with README's summary and needs and the committed notebooks."""
    readme = readme_syllabus(root / "README.md")
    found: dict[str, Topic] = {}
    for registered in TOPICS:
        parts = [path for path in registered.lesson_paths if (root / path).exists()]
        problems = f"exercises/{registered.problem_set}" if (root / "exercises" / registered.problem_set).exists() else None
        if not parts:
            summary, needs = readme.get(registered.number, (registered.title, ""))
            found[registered.number] = Topic(registered.number, summary, needs, None, problems)
            continue
        title = re.sub(r"^\d\d[a-z]?\s*·\s*", "", notebook_title(root / parts[0]))
        summary, needs = readme.get(registered.number, (title, ""))
        found[registered.number] = Topic(registered.number, summary, needs, parts[0], problems, title, parts)
    for number, (summary, needs) in readme.items():
        found.setdefault(number, Topic(number, summary, needs))
    return [found[k] for k in sorted(found)]


def _seconds(times: dict[str, float], path: str | None) -> str:
    return f"{times[path]:.0f} s" if path in times else "–"


def _link_bar(page: str, topic: Topic, repo: str, branch: str) -> str:
    """HTML links under a page's title; `page` is the repository path of the notebook shown."""
    is_lesson = page.startswith("notebooks/")
    links = [
        (f"../files/{page}", "Notebook (.ipynb)" if is_lesson else "Problem set (.ipynb)", "download"),
        (COLAB.format(repo=repo, branch=branch, path=page), "Open in Colab", "colab"),
        (GITHUB.format(repo=repo, branch=branch, path=page), "Source on GitHub", "source"),
    ]
    if is_lesson and topic.problems:
        links.append((f"../{topic.problems[:-6]}.html", "Problem set →", "problems"))
    if not is_lesson and topic.lesson:
        links.append((f"../{topic.lesson[:-6]}.html", "← Lesson", "lesson"))
    anchors = "".join(f'<a class="{cls}" href="{html.escape(href)}">{html.escape(text)}</a>' for href, text, cls in links)
    return f'<div class="course-links">{anchors}</div>'


def _math_html(content: str, config: dict) -> str:
    tex = html.escape(content)
    return f"\\[{tex}\\]" if config.get("display_mode") else f"\\({tex}\\)"


def _render_details(source: str) -> str:
    """Each `<details><summary>..</summary> Markdown </details>` as one line of HTML, its Markdown and math rendered.

    Jupyter renders Markdown inside a <details> block; CommonMark (MyST) keeps an HTML block raw up to the
    next blank line, and splitting the block there would move a list's answers out of their <details>.
    """
    from markdown_it import MarkdownIt
    from mdit_py_plugins.dollarmath import dollarmath_plugin

    md = MarkdownIt("commonmark").enable("table").use(dollarmath_plugin, renderer=_math_html)

    def one(m: re.Match) -> str:
        summary = md.renderInline(m.group(1).strip())
        body = md.render(textwrap.dedent(m.group(2)).strip())
        if "<pre" not in body:
            body = " ".join(line.strip() for line in body.splitlines() if line.strip())
        else:
            body = "\n".join(line for line in body.splitlines() if line.strip())
        return f"<details><summary>{summary}</summary>{body}</details>"

    return re.sub(r"<details>\s*<summary>(.*?)</summary>(.*?)</details>", one, source, flags=re.S)


def _terminal_text(text: str) -> str:
    """What a terminal (and Jupyter) shows for text with carriage returns: each `\\r` restarts its line."""
    lines = []
    for line in text.split("\n"):
        parts = line.rstrip("\r").split("\r")
        shown = ""
        for part in parts:  # a later part overwrites the start of the line
            shown = part + shown[len(part):]
        lines.append(shown)
    return "\n".join(lines)


def _merge_streams(outputs: list) -> list:
    """Consecutive stream outputs of one name as one, carriage returns resolved (progress bars show their end)."""
    merged: list = []
    for output in outputs:
        if output.get("output_type") == "stream" and merged and merged[-1].get("output_type") == "stream" \
                and merged[-1].get("name") == output.get("name"):
            merged[-1]["text"] += output["text"]
        else:
            merged.append(output)
    for output in merged:
        if output.get("output_type") == "stream" and "\r" in output["text"]:
            output["text"] = _terminal_text(output["text"])
    return merged


def stage_notebook(src: Path, dest: Path, bar: str) -> None:
    """Copy a notebook, with the link bar placed right under its H1 title."""
    nb = nbformat.read(src, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown" and "<details" in cell.source:
            cell.source = _render_details(cell.source)
        if cell.cell_type == "code":
            cell.outputs = _merge_streams(cell.outputs)
        for output in cell.get("outputs", []):
            if WIDGET_VIEW in output.get("data", {}):
                output["data"] = {"text/html": WIDGET_NOTE}
    # Rendering saved widget state needs JavaScript from a CDN; the site works offline instead.
    nb.metadata.pop("widgets", None)
    first = next((c for c in nb.cells if c.cell_type == "markdown"), None)
    if first is not None and re.search(r"^#\s+.+$", first.source, flags=re.M):
        first.source = re.sub(r"^(#\s+.+)$", lambda m: f"{m.group(1)}\n\n{bar}\n", first.source, count=1, flags=re.M)
    else:
        nb.cells.insert(0, nbformat.v4.new_markdown_cell(bar))
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)


def readme_intro(readme: Path = ROOT / "README.md") -> str:
    """README's paragraphs between the title and the first `##` section."""
    text = readme.read_text(encoding="utf-8")
    match = re.search(r"^# .+?$(.*?)(?=^## )", text, flags=re.M | re.S)
    return match.group(1).strip() if match else ""


def front_page(all_topics: list[Topic], times: dict[str, float], machine: dict, repo: str, branch: str) -> str:
    rows = []
    for t in all_topics:
        if len(t.parts) > 1:
            lesson = " · ".join(f"[{Path(p).name[2]}]({p})" for p in t.parts)
        else:
            lesson = f"[lesson]({t.lesson})" if t.lesson else "planned"
        problems = f"[problem set]({t.problems})" if t.problems else ("planned" if not t.lesson else "–")
        solution = t.problems and "solutions/" + t.problems.split("/", 1)[1]
        time_cell = f"{' + '.join(_seconds(times, p) for p in t.parts)} / {_seconds(times, solution)}" if t.lesson else ""
        rows.append(f"| {t.number} | {t.summary} | {lesson} | {problems} | {t.needs} | {time_cell} |")
    where = ", ".join(str(machine[k]) for k in ("cpu", "machine") if machine.get(k))
    cores = f"{machine['cpu_count']}-core " if machine.get("cpu_count") else ""
    date = f", recorded {machine['date']}" if machine.get("date") else ""
    toctrees = []
    for t in all_topics:
        if not t.lesson:
            continue
        names = ["Lesson"] if len(t.parts) == 1 else [f"Lesson {Path(p).name[:3]}" for p in t.parts]
        entries = [f"{n} <{p[:-6]}>" for n, p in zip(names, t.parts)] + ([f"Problem set <{t.problems[:-6]}>"] if t.problems else [])
        caption = f"{t.number} · {t.title}"
        toctrees.append("```{toctree}\n:hidden:\n:caption: " + caption + "\n\n" + "\n".join(entries) + "\n```")
    github = f"https://github.com/{repo}"
    return "\n".join([
        "# Loops to Kernels", "",
        readme_intro(), "",
        "## Syllabus", "",
        "Each topic is a lesson (read it here with its outputs, or run it) and a problem set whose checks grade your code.",
        "", "| # | topic | lesson | problem set | needs | CPU time (lesson / problems) |", "|---|---|---|---|---|---|",
        *rows, "",
        f"CPU times are wall-clock seconds per notebook, kernel start included, on a {cores}{where} machine without a GPU{date}, "
        f"read from [`benchmarks/results/notebook_times_cpu.json`]({GITHUB.format(repo=repo, branch=branch, path='benchmarks/results/notebook_times_cpu.json')}).",
        "", "## Run it", "",
        f"Every page links to its notebook file and opens it in Colab. To run the course on your machine, clone [the repository]({github}) and:",
        "", "```bash", "make lab     # creates .venv, installs the course, opens JupyterLab on notebooks/",
        "make test    # the whole test suite: every notebook re-executed and compared", "```", "",
        "This site shows the outputs committed in the notebooks; it was built without running them.", "",
        f"Code is under the MIT licence and text under CC BY 4.0 ([LICENSE]({GITHUB.format(repo=repo, branch=branch, path='LICENSE')})); "
        f"to cite the course, see [CITATION.cff]({GITHUB.format(repo=repo, branch=branch, path='CITATION.cff')}).", "",
        *toctrees, "",
    ])


def mathjax_dir() -> Path:
    import jupyter_server_mathjax

    path = Path(jupyter_server_mathjax.__file__).parent / "static"
    if not (path / "MathJax.js").exists():
        raise SystemExit(f"MathJax.js not found in {path}: reinstall jupyter-server-mathjax")
    return path


def build(out: Path = DEFAULT_OUT, repo: str | None = None, branch: str = "main", strict: bool = False,
          quiet: bool = True, root: Path = ROOT) -> Path:
    repo = repo or os.environ.get("COURSE_REPOSITORY") or os.environ.get("GITHUB_REPOSITORY") or DEFAULT_REPOSITORY
    out = Path(out).resolve()
    all_topics = topics(root)
    times, machine = recorded_times(root / TIMES.relative_to(ROOT))
    with tempfile.TemporaryDirectory(prefix="course-site-") as tmp:
        src, doctrees = Path(tmp) / "src", Path(tmp) / "doctrees"
        src.mkdir()
        for t in all_topics:
            for page in t.pages:
                stage_notebook(root / page, src / page, _link_bar(page, t, repo, branch))
        (src / "index.md").write_text(front_page(all_topics, times, machine, repo, branch), encoding="utf-8")
        # Sphinx writes into the temporary folder (MyST-NB puts its image files beside the output folder).
        html_dir = Path(tmp) / "html"
        cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-c", str(SITE), "-d", str(doctrees), "--keep-going",
               *(["-q"] if quiet else []), *(["-W"] if strict else []), str(src), str(html_dir)]
        subprocess.run(cmd, check=True)
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(html_dir, out)
    shutil.copytree(mathjax_dir(), out / "_static" / "mathjax", dirs_exist_ok=True)
    for t in all_topics:
        for page in t.pages:
            (out / "files" / page).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / page, out / "files" / page)
    (out / ".nojekyll").touch()  # GitHub Pages: serve folders whose names start with "_"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (replaced)")
    parser.add_argument("--repository", help="OWNER/NAME for the Colab and source links")
    parser.add_argument("--branch", default=os.environ.get("COURSE_BRANCH", "main"))
    parser.add_argument("--strict", action="store_true", help="fail on any Sphinx warning")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    out = build(args.out, args.repository, args.branch, args.strict, quiet=not args.verbose)
    print(f"site built in {time.perf_counter() - start:.0f} s: {out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
