"""A trace shown in Jupyter as the page's own Inside view: one piece of HTML that holds the view's script and look
(the web page's view scripts, the sampler of its gptlite.js, its inside.css, read as files from the page's folder,
`gptlite/web/page/`) and the trace's numbers, so that it needs no server, no network and no CDN.
`Trace._repr_html_` returns it; saved to a file, it opens in any browser.
"""

import json
import pathlib
import re
import uuid

from gptlite.decode.settings import sampling_settings
from gptlite.inside.views import page_declarations

# The web page's files, which the view's script is (data of the package, beside `gptlite.web`'s modules).
_PAGE = pathlib.Path(__file__).parent.parent / "web" / "page"


def html(trace, state=None):
    """The HTML of `trace`'s Inside view, opened at `state` ({token, layer, head, step}, each optional: the last
    token, layer 0, head 0, the tokens by default)."""
    payload = trace.to_json(packed=True)
    root = f"gptlite-inside-{uuid.uuid4().hex[:12]}"
    data = json.dumps({"trace": payload, "sampling": sampling_settings(), "state": state or {},
                       "inside": page_declarations(trace.model.config)}, ensure_ascii=True)
    return (f'<style>{(_PAGE / "inside.css").read_text()}</style>\n'
            f'<div id="{root}" class="gptlite-inside" data-state="loading">the Inside view needs JavaScript</div>\n'
            f'<script type="application/json" id="{root}-data">{_safe_in_script(data)}</script>\n'
            f'<script type="module">\n{_script()}\n{_OPEN.replace("ROOT", root)}\n</script>\n')


# The view's scripts (page/), each importing only those before it: the sampler, the view's data, its drawing, its
# steps, the view. The exported page holds them as files; a notebook's view, as one module's text.
VIEW_SCRIPTS = ("gptlite.js", "inside_data.js", "inside_draw.js", "steps_input.js", "steps_attention.js",
                "steps_heads.js", "steps_output.js", "inside.js")


def _script(names=VIEW_SCRIPTS):
    """The page's scripts `names` as one module's text, without their imports and `export` words."""
    parts = []
    for name in names:
        source = (_PAGE / name).read_text()
        source = re.sub(r"^import .*?;\n", "", source, flags=re.MULTILINE | re.DOTALL)
        parts.append(re.sub(r"^export ", "", source, flags=re.MULTILINE))
    return "\n".join(parts)


def _safe_in_script(text):
    """JSON that cannot close its <script> element early."""
    return text.replace("</", "<\\/")


def film_html(film_json):
    """The HTML of a film's view (the page's film.js) for `Film.to_json`'s numbers: its slider, losses, heads, probe,
    embedding and writing, as the exported page shows them (not the Inside view of each frame: that runs the frame's
    model, which a notebook's view has not)."""
    root = f"gptlite-film-{uuid.uuid4().hex[:12]}"
    data = json.dumps(film_json, ensure_ascii=True)
    return (f'<style>{(_PAGE / "inside.css").read_text()}</style>\n'
            f'<section id="{root}" class="gptlite-film" data-state="loading">the film needs JavaScript</section>\n'
            f'<script type="application/json" id="{root}-data">{_safe_in_script(data)}</script>\n'
            f'<script type="module">\n{_script(("film.js",))}\n{_OPEN_FILM.replace("ROOT", root)}\n</script>\n')


# Reads the film beside the script and shows it at its last frame; the first of a document answers
# window.gptliteFilm().
_OPEN_FILM = """
{
  const root = document.getElementById("ROOT");
  const film = JSON.parse(document.getElementById("ROOT-data").textContent);
  const view = new FilmView(root, film, () => {});
  view.show();
  window.gptliteFilm ??= () => filmContract(film, view.index);
}
"""


# Reads the trace beside the script and shows it; the first view of a document answers window.gptliteInside().
_OPEN = """
{
  const root = document.getElementById("ROOT");
  const { trace: packed, sampling, state, inside } = JSON.parse(document.getElementById("ROOT-data").textContent);
  const trace = unpacked(packed);
  const view = new InsideView(root, { piece: (id) => trace.vocabulary[id], sampling, inside, settings: null,
    promptLength: trace.window_start + trace.ids.length });
  view.show(trace, state);
  if (!document.getElementById("inside")) {
    root.id = "inside";
    window.gptliteInside = () => (root.dataset.state === "done" ? view.contract() : null);
  }
}
"""
