"""``vvs-serve`` over real HTTP on 127.0.0.1: a real Ray instance and Ray Serve deployment of the tiny engine
folder, started once for this module and shut down after it."""
import base64
import io
import json
import socket
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import ray
import torch
from PIL import Image
from ray import serve

from vvs.engines import load_engines
from vvs.runtime.pipeline import Pipeline
from vvs.serve.client import Client, ServeError
from vvs.serve.deployment import application

MAX_IMAGES = 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_folder):
    port = _free_port()
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(application(str(tiny_folder), backend="onnxruntime", threads=1, max_batch=4, max_images=MAX_IMAGES,
                              max_request_bytes=1 << 20), name="vvs")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def local(tiny_folder):
    return Pipeline(load_engines(tiny_folder, "onnxruntime", threads=1))


def _pixels(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"))


REQUESTS = [([1, 2], 0, "vvs"), ([3], 10, "sd"), ([4, 5, 6], 20, "vvs"), ([7], 30, "ar"), ([8, 9], 40, "lantern"),
            ([0, 0], 50, "vvs"), ([2, 6], 60, "sjd"), ([5], 70, "sjd-pac"), ([1, 8], 80, "gsd")]


def options_of(mode: str) -> dict:
    """The options a request of ``mode`` sends: an option its mode does not read is refused."""
    own = {"vvs": dict(skip_interval=2), "sjd": dict(window=8), "gsd": dict(window=8),
           "sjd-pac": dict(window=8, pac_tree_width=2, pac_tree_depth=2)}
    return dict(temperature=1.0, cfg_scale=2.0, **own.get(mode, {}))


def test_concurrent_clients_get_the_images_they_would_get_alone(server, local):
    client = Client(server, timeout=120)
    with ThreadPoolExecutor(max_workers=len(REQUESTS)) as pool:
        results = list(pool.map(lambda r: client.generate(r[0], mode=r[2], seed=r[1], **options_of(r[2])), REQUESTS))
    for (classes, seed, mode), result in zip(REQUESTS, results):
        alone = local.generate(classes, mode=mode, seed=seed, **options_of(mode))
        assert result.tokens == alone.tokens.tolist(), f"{mode} {classes}"
        for got, want in zip(result.images, alone.pil_images()):
            assert np.array_equal(_pixels(got), _pixels(want))
        assert [s["target_forwards"] for s in result.stats] == [s.target_forwards for s in alone.stats]
    model = client.model()
    assert model["max_images"] == MAX_IMAGES
    assert model["modes"] == [{"name": m, "exact": m in ("ar", "sd", "sjd", "sjd-pac")}
                              for m in ("ar", "sd", "lantern", "vvs", "vvs-uniform", "vvs-dynamic", "sjd", "sjd-pac",
                                        "sjd-pac-official", "gsd")]


def _post(url: str, body: bytes, content_type: str = "application/json", method: str = "POST") -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body if method == "POST" else None, method=method,
                                     headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


BAD = [
    (json.dumps({"conditions": [999]}).encode(), "application/json", 400, "class id 999 is out of range"),
    (json.dumps({"conditions": [1.5]}).encode(), "application/json", 400, "not an integer"),
    (json.dumps({"conditions": [1], "options": {"temperature": -1}}).encode(), "application/json", 400, "temperature"),
    (json.dumps({"conditions": [1], "options": {"top_q": 1}}).encode(), "application/json", 400, "unknown option"),
    (json.dumps({"conditions": [1], "mode": "fast"}).encode(), "application/json", 400, "mode"),
    (json.dumps({"conditions": [1], "seed": -3}).encode(), "application/json", 400, "seed"),
    (json.dumps({"conditions": [1], "wat": 1}).encode(), "application/json", 400, "unknown field"),
    # sizes bounded before anything is allocated (a window of 100000 once grew until the kernel killed the replica)
    (json.dumps({"conditions": [1], "mode": "sjd", "options": {"window": 100000}}).encode(), "application/json", 400,
     "option window=100000: must be at most the image's"),
    (json.dumps({"conditions": [1], "mode": "sd", "options": {"tree_size": 5000}}).encode(), "application/json", 400,
     "option tree_size=5000: must be in [2, 512]"),
    (json.dumps({"conditions": [1], "mode": "sd", "options": {"depth": 10**6}}).encode(), "application/json", 400,
     "option depth=1000000: must be in [0, 16]"),
    # an option the mode does not read is refused, as on the command line
    (json.dumps({"conditions": [1], "mode": "vvs", "options": {"window": 32}}).encode(), "application/json", 400,
     "option window applies to modes sjd, sjd-pac or gsd only, not vvs-uniform"),
    (json.dumps({"conditions": [1] * (MAX_IMAGES + 1)}).encode(), "application/json", 413, "at most 64"),
    (b'{"conditions": [1', "application/json", 400, "malformed JSON"),
    (b"[1, 2]", "application/json", 400, "JSON object"),
    (json.dumps({"conditions": [1]}).encode(), "text/plain", 415, "application/json"),
    (json.dumps({"conditions": [2**70]}).encode(), "application/json", 400, f"class id {2**70} is out of range"),
    (b"[" * 100000 + b"]" * 100000, "application/json", 400, "nested too deeply"),
    (json.dumps({"conditions": [1], "seed": 0, "pad": "x" * (2 << 20)}).encode(), "application/json", 413,
     "request body over 1048576 bytes"),
    (json.dumps({"conditions": [True]}).encode(), "application/json", 400, "class id true is not an integer"),
    (json.dumps({"conditions": [1], "decode": None}).encode(), "application/json", 400, "got null"),
    (json.dumps({"conditions": ["wolf"]}).encode(), "application/json", 400,
     "'wolf' is not a class of this class-conditional model; give a class id (0-9) or a name (tench, goldfish"),
]


@pytest.mark.parametrize("body,content_type,status,message", BAD, ids=[b[3] for b in BAD])
def test_a_bad_request_gets_a_4xx_with_one_line(server, body, content_type, status, message):
    code, data = _post(server + "/v1/generate", body, content_type)
    assert code == status
    assert message in data["error"] and "\n" not in data["error"] and "Traceback" not in data["error"]


def test_an_oversized_window_leaves_the_replica_serving(server):
    code, data = _post(server + "/v1/generate", json.dumps({"conditions": [1, 2], "mode": "gsd",
                                                            "options": {"window": 10**5}}).encode())
    assert code == 400 and "window" in data["error"], data
    code, data = _post(server + "/v1/generate", json.dumps({"conditions": [2], "mode": "gsd"}).encode())
    assert code == 200 and len(data["tokens"]) == 1


def test_unknown_routes_and_methods_and_the_server_keeps_serving(server):
    assert _post(server + "/v1/nope", b"{}")[0] == 404
    assert _post(server + "/v1/generate", b"", method="GET")[0] == 405
    code, data = _post(server + "/v1/generate", json.dumps({"conditions": [2], "mode": "ar"}).encode())
    assert code == 200 and len(data["images"]) == 1
    assert Image.open(io.BytesIO(base64.b64decode(data["images"][0]))).format == "PNG"


def _wait_idle(client: Client, timeout: float) -> float:
    start = time.monotonic()
    while (h := client.health())["running_images"] or h["waiting_images"]:
        assert time.monotonic() - start < timeout, f"slots still held: {h}"
        time.sleep(0.02)
    return time.monotonic() - start


def test_a_client_that_disconnects_does_not_keep_its_slots(server):
    client = Client(server, timeout=120)
    body = json.dumps({"conditions": list(range(10)) * 6, "mode": "sd", "decode": False}).encode()
    start = time.monotonic()
    client.generate(list(range(10)) * 6, mode="sd", seed=1, decode=False)
    full = time.monotonic() - start

    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/generate HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (host.encode(), len(body)) + body)
        deadline = time.monotonic() + 30
        while client.health()["running_images"] == 0:
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.01)
    freed = _wait_idle(client, timeout=full)
    assert freed < full / 2, f"slots freed {freed:.2f} s after the disconnect; the whole request takes {full:.2f} s"


def test_a_killed_replica_fails_its_request_clearly_and_is_restarted(server):
    client = Client(server, timeout=120)
    outcome = {}

    def request():
        try:
            outcome["result"] = client.generate(list(range(10)) * 6, mode="sd", decode=False)
        except ServeError as err:
            outcome["error"] = err

    thread = threading.Thread(target=request)
    thread.start()
    deadline = time.monotonic() + 30
    while client.health()["running_images"] == 0:
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.01)
    replica = next(a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("SERVE_REPLICA"))
    ray.kill(ray.get_actor(replica["name"], namespace=replica["namespace"]), no_restart=True)
    thread.join(timeout=60)
    assert not thread.is_alive(), "the client hangs after its replica died"
    assert "error" in outcome and outcome["error"].status >= 500, outcome
    assert "replica" in str(outcome["error"])

    deadline = time.monotonic() + 90  # Ray Serve starts a new replica
    while True:
        try:
            client.health()
            break
        except ServeError:
            assert time.monotonic() < deadline, "no replica came back"
            time.sleep(0.5)
    assert len(client.generate([3], mode="ar", decode=False).tokens) == 1


@pytest.mark.parametrize("conditions, sent", [("a cat", ["a cat"]), ("cat", ["cat"]), ([3, 5], [3, 5]), ((1,), [1]),
                                              (np.array([2, 4]), [2, 4])])
def test_the_client_sends_a_string_as_one_prompt(monkeypatch, conditions, sent):
    """No server needed: the body the client would send. A string used to go out as a list of its characters."""
    from email.message import Message

    client, bodies = Client("http://127.0.0.1:9"), []

    def request(method, path, body=None):
        bodies.append(body)
        return {"tokens": [], "stats": [], "options": {}}, Message()

    monkeypatch.setattr(client, "_request", request)
    client.generate(conditions, decode=False)
    assert bodies[0]["conditions"] == sent


@pytest.mark.parametrize("conditions", [3, 2.5, None, np.int64(3)])
def test_the_client_refuses_a_single_value_in_one_line(conditions):
    with pytest.raises(ServeError, match=r"^conditions: give a list of class ids or prompts \(a string is one "
                                         r"prompt\), not \w+ "):
        Client("http://127.0.0.1:9").generate(conditions)


def test_the_replica_reports_its_phases_in_server_timing(server):
    """Server-Timing splits a request's time in the replica (read and parse, tokens, pixels, PNG encoding), so the
    rest of a client's latency is the network and Ray's proxy."""
    client = Client(server, timeout=120)
    start = time.perf_counter()
    result = client.generate([3], mode="vvs", seed=1)
    latency = time.perf_counter() - start
    phases = result.server_seconds
    assert list(phases) == ["request", "tokens", "pixels", "encode"]
    assert phases["tokens"] > 0 and all(v >= 0 for v in phases.values())
    assert sum(phases.values()) < latency


@pytest.fixture(scope="module")
def t2i_server(server, text_folder):
    """A text-conditional folder with its text encoder, deployed beside the class-conditional one under its own
    route prefix."""
    serve.run(application(str(text_folder), backend="onnxruntime", threads=1, max_batch=4), name="t2i",
              route_prefix="/t2i")
    yield server + "/t2i"
    serve.delete("t2i")


def test_prompts_over_http(server, t2i_server, text_folder):
    """Prompts in, the Pipeline's tokens and images out; a prompt to the class-conditional app, a caption mask with
    prompts and an empty prompt are 400s with one line."""
    client = Client(t2i_server, timeout=120)
    model = client.model()
    assert model["prompts"] is True and model["num_classes"] == 0  # a text-to-image folder has no classes
    prompts = ["a red bird", "un café crème 🙂"]
    result = client.generate(prompts, mode="vvs", seed=3)
    alone = Pipeline(load_engines(text_folder, "onnxruntime", threads=1)).generate(prompts, mode="vvs", seed=3)
    assert result.tokens == alone.tokens.tolist()
    assert np.array_equal(_pixels(result.images[1]), _pixels(alone.pil_images()[1]))
    for url, body, message in (
            (server, {"conditions": ["a cat"]}, "'a cat' is not a class of this class-conditional model"),
            (t2i_server, {"conditions": ["a cat"], "caption_mask": [[True] * 3]}, "caption_mask goes with"),
            (t2i_server, {"conditions": ["a cat", " "]}, "prompt 2 of 2 is empty"),  # counted as vvs-run does
            (t2i_server, {"conditions": [3, 5]}, "got [3, 5], but this model is text-conditional; give prompts"),
            (t2i_server, {"conditions": [[[0.5] * 8] * 3]}, "caption embeddings need their mask [n, C]")):
        code, data = _post(url + "/v1/generate", json.dumps(body).encode())
        assert code == 400 and message in data["error"] and "\n" not in data["error"], data


def test_janus_prompts_over_http(server, janus_folder):
    """A Janus-Pro folder (prompts through the target's own tokenizer) deployed beside the others: the model
    endpoint says it takes prompts, and prompts give the Pipeline's tokens."""
    from tests.conftest import JANUS_PROMPTS

    serve.run(application(str(janus_folder), backend="onnxruntime", threads=1, max_batch=4), name="janus",
              route_prefix="/janus")
    try:
        client = Client(server + "/janus", timeout=120)
        model = client.model()
        assert model["prompts"] is True and model["model_type"] == "t2i" and model["caption_dim"] == 0
        result = client.generate(JANUS_PROMPTS, mode="sd", seed=5, decode=False)
        alone = Pipeline(load_engines(janus_folder, "onnxruntime", threads=1)).generate(
            JANUS_PROMPTS, mode="sd", seed=5, decode_images=False)
        assert result.tokens == alone.tokens.tolist()
        code, data = _post(server + "/janus/v1/generate", json.dumps({"conditions": ["a cat " * 20]}).encode())
        assert code == 400 and "this folder takes at most 12" in data["error"], data
    finally:
        serve.delete("janus")


def test_lumina_prompts_over_http(server, lumina_folder):
    """A Lumina-mGPT folder deployed beside the others: prompts give the Pipeline's tokens, each row closed by the
    forced end-of-line token; a prompt longer than its slots is a 400 with one line."""
    serve.run(application(str(lumina_folder), backend="onnxruntime", threads=1, max_batch=4), name="lumina",
              route_prefix="/lumina")
    try:
        client = Client(server + "/lumina", timeout=120)
        assert client.model()["prompts"] is True
        prompts = ["a red bird", "a photo of a cat on a sofa"]
        result = client.generate(prompts, mode="vvs", seed=5, decode=False)
        alone = Pipeline(load_engines(lumina_folder, "onnxruntime", threads=1)).generate(
            prompts, mode="vvs", seed=5, decode_images=False)
        assert result.tokens == alone.tokens.tolist()
        assert all(row[4::5] == [8192] * 4 for row in result.tokens)  # 4 x 4 codes: the end-of-line id after each row
        code, data = _post(server + "/lumina/v1/generate", json.dumps({"conditions": ["a cat " * 20]}).encode())
        assert code == 400 and "this folder takes at most 32" in data["error"], data
    finally:
        serve.delete("lumina")


def test_names_the_cli_takes_are_taken_over_http(server, local):
    """One vocabulary: the mode names and class names of ``vvs-run`` work in a request as they do there."""
    code, data = _post(server + "/v1/generate", json.dumps({"conditions": ["great white shark", "2"], "seed": 4,
                                                            "mode": "vvs-uniform", "decode": False}).encode())
    alone = local.generate(torch.tensor([2, 2]), mode="vvs", skip_policy="uniform", seed=4, decode_images=False)
    assert code == 200 and data["tokens"] == alone.tokens.tolist()
    assert data["options"]["skip_policy"] == "uniform"


def _openai(url: str):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="vvs-takes-no-key", max_retries=0, timeout=120)


def _png_pixels(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def test_the_openai_client_paints_a_prompt(t2i_server, text_folder):
    """The official ``openai`` package against the text-to-image service: the model it lists, two images of one
    prompt with vvs's own fields in ``extra_body``, equal to the Pipeline's."""
    client = _openai(t2i_server)
    assert [m.id for m in client.models.list().data] == ["llamagen-t2i"]
    size = json.loads((text_folder / "manifest.json").read_text())["model"]["image_size"]
    result = client.images.generate(model="llamagen-t2i", prompt="a red bird", n=2, size=f"{size}x{size}",
                                    response_format="b64_json", extra_body={"mode": "sd", "seed": 3, "top_k": 8})
    alone = Pipeline(load_engines(text_folder, "onnxruntime", threads=1)).generate(["a red bird"] * 2, mode="sd",
                                                                                   seed=3, top_k=8)
    assert len(result.data) == 2 and result.created > 0
    for answer, image in zip(result.data, alone.pil_images()):
        assert np.array_equal(_png_pixels(answer.b64_json), _pixels(image))


def test_the_openai_client_names_a_class(server, local):
    """On a class-conditional service the prompt is a class name (or id as text)."""
    result = _openai(server).images.generate(prompt="great white shark", n=2, extra_body={"mode": "ar", "seed": 5})
    alone = local.generate(torch.tensor([2, 2]), mode="ar", seed=5)
    for answer, image in zip(result.data, alone.pil_images()):
        assert np.array_equal(_png_pixels(answer.b64_json), _pixels(image))


OPENAI_BAD = [
    (dict(prompt="tench", size="1024x1024"), 400, "size", "this model paints 8x8 only"),
    (dict(prompt="tench", response_format="url"), 400, "response_format", "returns the images in the answer only"),
    (dict(prompt="tench", model="dall-e-3"), 404, "model", "this service serves 'llamagen-c2i' only"),
    (dict(prompt="tench", n=MAX_IMAGES + 1), 413, "n", f"{MAX_IMAGES + 1} images requested; this server takes at most"),
    (dict(prompt="a cat"), 400, "prompt", "'a cat' is not a class of this class-conditional model"),
    (dict(prompt="tench", extra_body={"seed": -1}), 400, "seed", "seed -1: seeds must be integers"),
    (dict(prompt="tench", extra_body={"timeout": 0}), 400, "timeout", "timeout 0: give the seconds"),
    (dict(prompt="tench", extra_body={"mode": "ar", "window": 32}), 400, "window", "option window applies to modes"),
    (dict(prompt="tench", extra_body={"mode": "fast"}), 400, "mode", "unknown mode"),
    (dict(prompt="tench", extra_body={"quality": "hd"}), 400, "quality", "unknown field(s) quality"),
]


@pytest.mark.parametrize("kwargs,status,param,message", OPENAI_BAD, ids=[b[3] for b in OPENAI_BAD])
def test_the_openai_client_reads_a_refusal(server, kwargs, status, param, message):
    """A refusal is OpenAI's error object, which the client raises as its own error with status, type and param."""
    import openai

    with pytest.raises(openai.APIStatusError) as err:
        _openai(server).images.generate(**kwargs)
    assert err.value.status_code == status and err.value.param == param
    assert err.value.type == "invalid_request_error" and message in err.value.body["message"], err.value.body


def test_an_images_request_without_a_prompt_is_refused_in_openai_s_shape(server):
    """... and a field sent as null counts as absent, as the SDKs that send every field they know expect."""
    code, data = _post(server + "/v1/images/generations", json.dumps({"n": 1}).encode())
    assert code == 400 and data["error"]["param"] == "prompt" and data["error"]["code"] is None
    assert data["error"]["message"].startswith("prompt: give a class name or id (this model is class-conditional)")
    nulls = {"prompt": "1", "model": None, "n": None, "size": None, "response_format": None, "mode": "ar"}
    code, data = _post(server + "/v1/images/generations", json.dumps(nulls).encode())
    assert code == 200 and len(data["data"]) == 1, data


def chromium_driver():
    """Headless Chromium from the system packages (Debian: chromium, chromium-driver), driven by Selenium; the
    test is skipped, saying why, where they are not installed (.ci/run installs them)."""
    import shutil

    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium comes with the test extra")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (browser and driver):
        pytest.skip("no system Chromium and chromedriver (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))


def test_the_page_shows_ar_and_vvs_side_by_side_in_a_real_browser(server, local):
    """GET / in headless Chromium: pick a class and a seed, generate, and the AR and VVS images appear with their
    seconds, target forwards and tokens per forward — the same numbers and pixels the API gives."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    browser = chromium_driver()
    try:
        browser.get(server + "/")
        wait = WebDriverWait(browser, 120)
        classes = local.engines.target.num_classes
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#class option")) == classes)
        assert not browser.find_element(By.ID, "prompt").is_displayed()  # a class-conditional model
        Select(browser.find_element(By.ID, "class")).select_by_value("3")
        seed = browser.find_element(By.ID, "seed")
        seed.clear()
        seed.send_keys("abc")  # refused in red, not sent as seed 0
        browser.find_element(By.ID, "generate").click()
        status = browser.find_element(By.ID, "status")
        wait.until(lambda b: "not a whole number" in status.text)
        assert status.value_of_css_property("color") in ("rgba(176, 0, 32, 1)", "rgb(176, 0, 32)")
        assert not browser.find_elements(By.CSS_SELECTOR, "#results figure")
        seed.clear()
        seed.send_keys("7")
        browser.find_element(By.ID, "generate").click()
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "#results figure")) == 2
                   and "Done" in b.find_element(By.ID, "status").text)
        figures = browser.find_elements(By.CSS_SELECTOR, "#results figure")
        assert [f.get_attribute("data-mode") for f in figures] == ["ar", "vvs"]
        for figure in figures:
            mode = figure.get_attribute("data-mode")
            alone = local.generate([3], mode=mode, seed=7)
            img = figure.find_element(By.TAG_NAME, "img")
            assert browser.execute_script("return arguments[0].naturalWidth", img) == alone.images.shape[-1]
            png = base64.b64decode(img.get_attribute("src").split(",", 1)[1])
            assert np.array_equal(_pixels(Image.open(io.BytesIO(png))), _pixels(alone.pil_images()[0]))
            caption = figure.find_element(By.TAG_NAME, "figcaption").text
            assert f"{alone.stats[0].target_forwards} target forwards" in caption
            assert ("changes the distribution" in caption) == (mode == "vvs")
    finally:
        browser.quit()


def test_the_page_takes_a_prompt_in_a_real_browser(t2i_server, text_folder):
    """The page of a text-conditional folder (under a route prefix): type a prompt, pick sd and sjd-pac as well,
    generate; the four images are the API's for that prompt and seed."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser = chromium_driver()
    try:
        browser.get(t2i_server)
        wait = WebDriverWait(browser, 120)
        wait.until(lambda b: b.find_element(By.ID, "prompt").is_displayed())
        assert not browser.find_element(By.ID, "class").is_displayed()
        prompt = browser.find_element(By.ID, "prompt")
        prompt.clear()
        prompt.send_keys("a red bird on a branch")
        browser.find_element(By.CSS_SELECTOR, "input[value=sd]").click()
        browser.find_element(By.CSS_SELECTOR, "input[value=sjd-pac]").click()  # the picker lists every mode
        browser.find_element(By.ID, "generate").click()
        wait.until(lambda b: "Done" in b.find_element(By.ID, "status").text)
        figures = browser.find_elements(By.CSS_SELECTOR, "#results figure")
        assert [f.get_attribute("data-mode") for f in figures] == ["ar", "sd", "vvs", "sjd-pac"]
        pipe = Pipeline(load_engines(text_folder, "onnxruntime", threads=1))
        for figure in figures:
            alone = pipe.generate(["a red bird on a branch"], mode=figure.get_attribute("data-mode"), seed=0)
            png = base64.b64decode(figure.find_element(By.TAG_NAME, "img").get_attribute("src").split(",", 1)[1])
            assert np.array_equal(_pixels(Image.open(io.BytesIO(png))), _pixels(alone.pil_images()[0]))
    finally:
        browser.quit()
