"""The course website (site/build.py): it builds from the committed notebooks, and in headless Chromium it
shows every figure, renders all math offline, has no broken internal link and logs no console error.

Needs the `site` extra (`pip install -e ".[site]"`) and Debian's `chromium` for the browser checks; skipped
otherwise. `make site-test` runs this file; set SITE_SCREENSHOTS=DIR to keep the screenshots.
"""
from __future__ import annotations

import html
import importlib.util
import json
import os
import shutil
import sys
import time

import pytest

from course_utils.paths import ROOT

for _module in ("sphinx", "myst_nb", "sphinx_book_theme", "sphinx_copybutton", "jupyter_server_mathjax"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"the site extra is not installed ({_module} missing): pip install -e '.[site]'", allow_module_level=True)


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"course_site_{name}", ROOT / "site" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


check = _load("check")
build = _load("build")
needs_chromium = pytest.mark.skipif(check.chromium() is None, reason="chromium is not installed (Debian: apt-get install chromium)")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site") / "html"
    start = time.perf_counter()
    build.build(out, repo="example/loops-to-kernels")
    print(f"site built in {time.perf_counter() - start:.0f} s")
    return out


# --- the checker finds what it must find (fast, no build) -------------------------------------------------

def test_raw_latex_and_mathjax_errors_are_reported():
    static = '<p><span class="math notranslate nohighlight">\\(x\\)</span></p>'
    rendered = ('<p><span class="math"><span class="MathJax" id="MathJax-Element-1-Frame">x</span>'
                '<script type="math/tex">x^2</script></span> and <code>\\frac{a}{b}</code></p>')
    assert check.dom_problems("ok.html", static, rendered, []) == []
    for raw in ("$$x$$", "\\frac{a}{b}", "\\(x\\)", "$\\alpha$", "$x_t$"):
        problems = check.dom_problems("p.html", static, f"<p>{raw}</p>" + rendered, [])
        assert any("raw LaTeX" in p for p in problems), raw
    assert any("rendered by MathJax" in p for p in check.dom_problems("p.html", static, "<p>x</p>", []))
    assert any("MathJax reported" in p for p in check.dom_problems("p.html", static, rendered + '<span class="MathJax_Error">', []))


def test_console_messages_fail_except_the_themes_own():
    benign = ['"[PST]: Changed to auto mode using the light theme.", source: x (1)']
    assert check.dom_problems("p.html", "", "<p></p>", benign) == []
    problems = check.dom_problems("p.html", "", "<p></p>", ['"Uncaught ReferenceError: f is not defined", source: x (1)'])
    assert problems and "console" in problems[0]


def test_broken_links_network_resources_and_empty_images_are_reported(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "fig.png").write_bytes(b"")
    (tmp_path / "b.html").write_text('<h1 id="top">b</h1>')
    (tmp_path / "a" / "page.html").write_text(
        '<a href="../b.html#top">ok</a><a href="../b.html#nope">anchor</a><a href="missing.html">gone</a>'
        '<a href="https://example.org/">external links are fine</a>'
        '<script src="https://cdn.example.org/x.js"></script><img src="fig.png">')
    problems = check.static_problems(tmp_path)
    assert any("broken anchor" in p and "#nope" in p for p in problems)
    assert any("broken link" in p and "missing.html" in p for p in problems)
    assert any("loads from the network" in p for p in problems)
    assert any("not an image" in p for p in problems)
    assert not any("#top" in p or "example.org/'" in p for p in problems)


@needs_chromium
@pytest.mark.slow
def test_chromium_reports_an_uncaught_exception(tmp_path):
    (tmp_path / "bad.html").write_text("<html><body><p>x</p><script>undefined_function();</script></body></html>")
    with check.serve(tmp_path) as base:
        dom, console = check.run_chromium(base + "bad.html", budget_ms=1000)
    assert "<p>x</p>" in dom
    assert any("undefined_function" in line for line in console)


# --- what the build changes in its staged copies of the notebooks ----------------------------------------

def test_progress_bars_show_their_last_state_as_in_jupyter():
    outputs = [{"output_type": "stream", "name": "stdout", "text": f"\rtraining: {i:3d}%"} for i in (0, 50, 100)]
    outputs.append({"output_type": "stream", "name": "stdout", "text": "\nloss 0.23\n"})
    assert build._merge_streams(outputs) == [{"output_type": "stream", "name": "stdout", "text": "training: 100%\nloss 0.23\n"}]
    assert build._terminal_text("abcdef\rXY\n") == "XYcdef\n"


def test_details_answers_stay_folded_with_their_markdown_and_math_rendered():
    source = "1. Why?\n<details><summary>Answer</summary>Because $x_t$ is **noisy** and `a_b`.</details>\n2. Next?"
    out = build._render_details(source)
    line = next(line for line in out.splitlines() if line.startswith("<details>"))
    assert line.endswith("</details>"), "the whole block must stay one HTML line"
    assert "\\(x_t\\)" in line and "<strong>noisy</strong>" in line and "<code>a_b</code>" in line
    assert out.splitlines()[-1] == "2. Next?"


# --- the built site ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_every_lesson_and_problem_set_has_a_page_and_the_front_page_reads_the_records(site):
    times = {n["notebook"]: n["seconds"] for n in json.loads((ROOT / "benchmarks/results/notebook_times_cpu.json").read_text())["notebooks"]}
    front = (site / "index.html").read_text()
    for lesson in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert (site / "notebooks" / f"{lesson.stem}.html").exists()
        assert (site / "files" / "notebooks" / lesson.name).read_bytes() == lesson.read_bytes()
        if (ROOT / "exercises" / lesson.name).exists():
            assert (site / "exercises" / f"{lesson.stem}.html").exists()
        key = f"notebooks/{lesson.name}"
        if key in times:
            assert f"{times[key]:.0f} s / " in front, f"the front page lacks {lesson.name}'s recorded time"
        page = (site / "notebooks" / f"{lesson.stem}.html").read_text()
        assert "colab.research.google.com/github/example/loops-to-kernels/blob/main/notebooks/" + lesson.name in page
    for number, (_, needs) in build.readme_syllabus().items():
        assert f"<td><p>{number}</p></td>" in front
        assert html.escape(needs, quote=False) in front, f"the front page lacks topic {number}'s needs from README"
    assert "copybutton" in (site / "notebooks" / "00_foundations.html").read_text()
    assert (site / "_static" / "mathjax" / "MathJax.js").exists()


@pytest.mark.slow
def test_links_figures_and_offline_assets(site):
    assert check.static_problems(site) == []
    assert check.figure_problems(site) == []


@needs_chromium
@pytest.mark.slow
def test_in_chromium_math_renders_and_nothing_is_broken(site, tmp_path):
    shots = tmp_path / "screenshots"
    problems = check.browser_problems(site, screenshots=shots)
    assert problems == [], "\n".join(problems)
    for name in ("front_page.png", "11_ddpm_ddim.png"):
        assert (shots / name).read_bytes()[:4] == b"\x89PNG"
    if os.environ.get("SITE_SCREENSHOTS"):
        shutil.copytree(shots, os.environ["SITE_SCREENSHOTS"], dirs_exist_ok=True)
