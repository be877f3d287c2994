"""Sphinx configuration of the course website (built by site/build.py; see its docstring).

build.py stages the committed notebooks and a generated front page into a source folder and runs
Sphinx with this file as the configuration (`-c site/`). Nothing is executed: the pages show the
outputs committed in the notebooks.
"""
from __future__ import annotations

import os

project = "Loops to Kernels"
author = "The Loops to Kernels authors"
copyright = "the Loops to Kernels authors; code MIT, text CC BY 4.0"

extensions = ["myst_nb", "sphinx_copybutton"]

# Notebooks are rendered as committed, never executed.
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath", "html_image"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type", "misc.highlighting_failure"]

# Math without network access: MathJax 2.7 shipped by the pip package jupyter-server-mathjax, which
# build.py copies to _static/mathjax. A relative mathjax_path is relative to _static/.
mathjax_path = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"
mathjax2_config = {
    # Sphinx writes \( \) and \[ \]; dollars as in Jupyter, for math inside raw HTML such as <details> answers.
    "tex2jax": {
        "inlineMath": [["$", "$"], ["\\(", "\\)"]],
        "displayMath": [["$$", "$$"], ["\\[", "\\]"]],
        "processEscapes": True,
    },
    # jupyter-server-mathjax ships only the STIX-Web fonts (as Jupyter's classic notebook used them).
    "HTML-CSS": {"availableFonts": [], "preferredFont": None, "webFont": "STIX-Web", "imageFont": None},
    "messageStyle": "none",
    "showMathMenu": False,
}
myst_update_mathjax = False  # myst would write a MathJax 3/4 configuration

html_theme = "sphinx_book_theme"
html_title = "Loops to Kernels"
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_copy_source = False  # the pages link to the pristine .ipynb files instead (files/...)
html_show_sourcelink = False
html_last_updated_fmt = None
html_theme_options = {
    "show_toc_level": 2,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "use_repository_button": bool(os.environ.get("COURSE_REPOSITORY_URL")),
    "repository_url": os.environ.get("COURSE_REPOSITORY_URL", ""),
    "home_page_in_toc": True,
    "navigation_with_keys": False,
}
# Copy buttons on code cells, without the prompts of console examples.
copybutton_prompt_text = r"\$ |>>> "
copybutton_prompt_is_regexp = True
copybutton_selector = "div.cell_input pre, div.highlight pre"

exclude_patterns = ["_build", "**.ipynb_checkpoints"]
