"""Caption cleaning as LlamaGen's text-to-image models saw it in training.

LlamaGen's T5 features were extracted from captions cleaned by PixArt's ``clean_caption``, applied twice; a prompt
cleaned differently gives the target a condition it never saw. :func:`clean_caption` applies the same steps in the
same order: URL, HTML, handle, CJK, file-name, shop-text and id removal, dash and quote normalisation, ``ftfy``
mojibake repair, whitespace folding.
"""
from __future__ import annotations

import html
import re
import urllib.parse

import ftfy
from bs4 import BeautifulSoup

_URL_TAIL = r"[a-zA-Z0-9.\-]+[.](?:com|co|ru|net|org|edu|gov|it)[\w/-]*\b\/?(?!@)"
_FILES = r"(?:png|jpg|jpeg|bmp|webp|eps|pdf|apk|mp4)"
_PUNCT = r"[#®•©™&@·º½¾¿¡§~\)\(\]\[\}\{\|\\\/\*]{1,}"
_DASHES = (r"[\u002D\u058A\u05BE\u1400\u1806\u2010-\u2015\u2E17\u2E1A\u2E3A\u2E3B\u2E40\u301C\u3030\u30A0\uFE31"
           r"\uFE32\uFE58\uFE63\uFF0D]+")
_CJK_BLOCKS = ("\u31c0-\u31ef", "\u31f0-\u31ff", "\u3200-\u32ff", "\u3300-\u33ff", "\u3400-\u4dbf", "\u4dc0-\u4dff",
               "\u4e00-\u9fff")  # strokes, katakana extensions, enclosed, compatibility, ideographs, hexagrams

# (pattern, replacement), in order, before the HTML is stripped ...
_BEFORE_HTML = [
    (r"<person>", "person"),
    (r"\b((?:https?:(?:\/{1,3}|[a-zA-Z0-9%])|" + _URL_TAIL + "))", ""),
    (r"\b((?:www:(?:\/{1,3}|[a-zA-Z0-9%])|" + _URL_TAIL + "))", ""),
]
# ... after it, up to the dash/underscore rule ...
_AFTER_HTML = [
    (r"@[\w\d]+\b", ""),  # @handles
    *((f"[{block}]+", "") for block in _CJK_BLOCKS),
    (_DASHES, "-"),
    (r"[`´«»“”¨]", '"'),
    (r"[‘’]", "'"),
    (r"&quot;?", ""),
    (r"&amp", ""),
    (r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}", " "),  # IP addresses
    (r"\d:\d\d\s+$", ""),  # article ids
    (r"\\n", " "),  # a literal backslash-n
    (r"#\d{1,3}\b", ""),
    (r"#\d{5,}\b", ""),
    (r"\b\d{6,}\b", ""),
    (r"[\S]+\." + _FILES, ""),  # file names
    (r"[\"\']{2,}", '"'),
    (r"[\.]{2,}", " "),
    (_PUNCT, " "),
    (r"\s+\.\s+", " "),
]
# ... and after the mojibake repair.
_AFTER_FIX = [
    (r"\b[a-zA-Z]{1,3}\d{3,15}\b", ""),  # product codes: jc6640, jc6640vc, 6640vc231, j2d1a2a
    (r"\b[a-zA-Z]+\d+[a-zA-Z]+\b", ""),
    (r"\b\d+[a-zA-Z]+\d+\b", ""),
    (r"(worldwide\s+)?(free\s+)?shipping", ""),
    (r"(free\s)?download(\sfree)?", ""),
    (r"\bclick\b\s(?:for|on)\s\w+", ""),
    (r"\b" + _FILES + r"(\simage[s]?)?", ""),
    (r"\bpage\s+\d+\b", ""),
    (r"\b\d*[a-zA-Z]+\d+[a-zA-Z]+\d+[a-zA-Z\d]*\b", " "),
    (r"\b\d+\.?\d*[xх×]\d+\.?\d*\b", ""),  # sizes: 1920x1080
    (r"\b\s+\:\s+", ": "),
    (r"(\D[,\./])\b", r"\1 "),
    (r"\s+", " "),
    (r"^[\"\']([\w\W]+)[\"\']$", r"\1"),  # surrounding quotes
    (r"^[\'\_,\-\:;]", ""),
    (r"[\'\_,\-\:\-\+]$", ""),
    (r"^\.\S+$", ""),
]
_SEPARATORS = re.compile(r"(?:\-|\_)")


def _apply(steps, text: str) -> str:
    for pattern, replacement in steps:
        text = re.sub(pattern, replacement, text)
    return text


def clean_caption(caption: str) -> str:
    """One pass of the cleaning (:func:`preprocess` applies it twice, as LlamaGen does)."""
    text = urllib.parse.unquote_plus(str(caption)).strip().lower()
    text = _apply(_BEFORE_HTML, text)
    text = BeautifulSoup(text, features="html.parser").text
    text = _apply(_AFTER_HTML, text)
    if len(_SEPARATORS.findall(text)) > 3:  # this-is-my-cute-cat
        text = _SEPARATORS.sub(" ", text)
    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return _apply(_AFTER_FIX, text).strip()


def preprocess(prompt: str) -> str:
    """A prompt as LlamaGen's T5 features saw captions: cleaned twice."""
    return clean_caption(clean_caption(prompt))
