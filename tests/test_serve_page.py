"""The page at ``/`` in a real headless browser (Debian's chromium + chromium-driver, driven by selenium).

Choose a pair, type two sentences, press Translate: the page shows the offline translation and its route;
hovering a translated word shades the source words by the attention weights the API returned; "Detect
language" shows the language found and the model that ran.

Without a browser (conftest.py's ``browser``) the test is skipped with a loud reason (and a warning in the summary);
with TRANSDUCE_REQUIRE_BROWSER=1 (set by .ci/run, which installs the browser) it fails instead.
"""

import pytest

httpx = pytest.importorskip("httpx", reason="server tests need httpx")
pytest.importorskip("uvicorn", reason="server tests need uvicorn (the serve extra)")
pytest.importorskip("prometheus_client", reason="server tests need prometheus-client (the serve extra)")

from live_server import Live, untrained_model  # noqa: E402

from transduce.api import load  # noqa: E402
from transduce.serve.registry import spec_from_dir  # noqa: E402
from transduce.serve.server import create_app  # noqa: E402

SENTENCES = ["A dog runs in the park.", "Two men are playing soccer."]


@pytest.mark.slow
def test_page_translates_and_shows_attention_on_hover(browser, tiny_model_dir, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    other = untrained_model(tiny_model_dir, tmp_path / "fr-en", "fr", "en")
    specs = [spec_from_dir(tiny_model_dir, name="en-fr"), spec_from_dir(other)]
    live = Live(create_app(specs=specs, load=lambda spec: load(spec.path)))
    try:
        browser.get(live.url + "/")
        wait = WebDriverWait(browser, 120)
        wait.until(lambda d: len(Select(d.find_element(By.ID, "pair")).options) == 4)
        pairs = Select(browser.find_element(By.ID, "pair"))
        assert [o.text for o in pairs.options] == [
            "English \u2192 French",
            "French \u2192 English",
            "Detect language \u2192 English",
            "Detect language \u2192 French",
        ]
        pairs.select_by_value("en|fr")
        browser.find_element(By.ID, "source").send_keys("\n".join(SENTENCES))
        browser.find_element(By.ID, "translate").click()
        wait.until(lambda d: d.find_element(By.ID, "plain").text.strip())
        assert browser.find_element(By.ID, "status").text == ""
        assert browser.find_element(By.ID, "plain").text == "\n".join(load(tiny_model_dir).translate(SENTENCES))
        assert browser.find_element(By.ID, "route").text == "route: en-fr"

        api = httpx.post(
            live.url + "/v1/attention", json={"text": SENTENCES[:1], "source": "en", "target": "fr"}, timeout=60
        ).json()["alignments"][0]
        line = browser.find_elements(By.CSS_SELECTOR, "#lines .line")[0]
        targets = line.find_elements(By.CSS_SELECTOR, ".tgt-word")
        sources = line.find_elements(By.CSS_SELECTOR, ".src-word")
        assert [t.text for t in targets] == api["target_words"] and [s.text for s in sources] == api["source_words"]
        j = 1  # the second target word
        ActionChains(browser).move_to_element(targets[j]).perform()
        wait.until(lambda d: sources[0].get_attribute("data-weight") is not None)
        shown = [float(s.get_attribute("data-weight")) for s in sources]
        assert shown == pytest.approx(api["weights"][j], abs=1e-4)
        strongest = max(range(len(shown)), key=shown.__getitem__)
        colour = "return getComputedStyle(arguments[0]).backgroundColor"
        assert browser.execute_script(colour, sources[strongest]) == "rgb(255, 140, 0)"  # full shade
        assert targets[j].get_attribute("title").startswith("attended to: " + api["source_words"][strongest])
        ActionChains(browser).move_to_element(browser.find_element(By.ID, "translate")).perform()
        wait.until(lambda d: sources[0].get_attribute("data-weight") is None)  # un-hovered: shading removed

        pairs.select_by_value("auto|en")  # the language detected and the route taken are shown
        source = browser.find_element(By.ID, "source")
        source.clear()
        source.send_keys("Un homme lit un livre.")
        browser.find_element(By.ID, "translate").click()
        wait.until(lambda d: d.find_element(By.ID, "route").text)
        assert browser.find_element(By.ID, "route").text == "route: fr-en (detected: French, 100%)"
        assert browser.find_element(By.ID, "plain").text == load(other).translate(["Un homme lit un livre."])[0]

        pairs.select_by_value("fr|en")  # an error from the server is shown on the page, not swallowed
        source = browser.find_element(By.ID, "source")
        source.clear()
        source.send_keys("x" * 2001)
        browser.find_element(By.ID, "translate").click()
        wait.until(lambda d: d.find_element(By.ID, "status").text.startswith("error:"))
        assert "2001 characters exceed the limit of 2000" in browser.find_element(By.ID, "status").text
    finally:
        live.stop()
