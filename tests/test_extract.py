import hashlib
import textwrap

import pytest

from pipeline.generate.extract import extract, save

FINAL = """\
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
"""

DRAFT = """\
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return x  # draft
"""


def fenced(code: str, lang: str = "python", fence: str = "```") -> str:
    return f"{fence}{lang}\n{code}{fence}\n"


def test_last_modelnew_block_wins_over_drafts_and_helpers():
    text = (
        "Let me think about the kernel.\n\n" + fenced(DRAFT)
        + "\nThat is slow; here is a helper:\n" + fenced("def helper():\n    return 1\n")
        + "\nFinal answer:\n\n" + fenced(FINAL)
        + "\nUsage notes:\n" + fenced("model = ModelNew()\n")
    )
    ex = extract(text)
    assert ex.error is None
    assert ex.code == FINAL
    assert ex.blocks_seen == 4
    assert ex.code_hash == hashlib.sha256(FINAL.encode()).hexdigest()[:16]


def test_indented_final_block_is_dedented():
    text = "1. First draft:\n" + fenced(DRAFT) + "2. Final:\n\n" + textwrap.indent(fenced(FINAL), "    ")
    ex = extract(text)
    assert ex.error is None
    assert ex.code == FINAL
    assert ex.blocks_seen == 2


def test_unclosed_last_fence_takes_the_rest():
    text = fenced(DRAFT) + "\nOut of tokens soon:\n```python\n" + FINAL
    ex = extract(text)
    assert ex.error is None
    assert ex.code == FINAL
    assert ex.blocks_seen == 2


def test_longer_fence_and_tilde_fence():
    inner = FINAL + '\nDOC = """\n```\nnot a fence end\n```\n"""\n'
    ex = extract("Here:\n" + fenced(inner, fence="````"))
    assert ex.error is None
    assert "not a fence end" in ex.code
    assert ex.blocks_seen == 1

    ex2 = extract(fenced(DRAFT) + fenced(FINAL, lang="py", fence="~~~"))
    assert ex2.code == FINAL


def test_think_section_modelnew_does_not_win():
    thinking_code = FINAL.replace("torch.relu(x)", "x * 0  # thinking")
    text = ("<think>\nMaybe:\n" + fenced(thinking_code) + "Hmm no.\n</think>\n\n"
            "The answer:\n" + fenced(DRAFT))
    ex = extract(text)
    assert ex.error is None
    assert ex.code == DRAFT
    assert ex.blocks_seen == 1


def test_think_after_answer_block_is_ignored():
    # A think section later in the text must not beat the answer's block either.
    text = fenced(FINAL) + "<think>" + fenced(DRAFT) + "</think>\nDone."
    ex = extract(text)
    assert ex.code == FINAL
    assert ex.blocks_seen == 1


def test_orphan_close_tag_ends_reasoning():
    # Templates that open <think> in the prompt leave only the closing tag in the completion.
    text = "reasoning...\n" + fenced(FINAL) + "</think>\nAnswer:\n" + fenced(DRAFT)
    ex = extract(text)
    assert ex.code == DRAFT
    assert ex.blocks_seen == 1


def test_unclosed_think_is_searched_as_last_resort():
    text = "<think>\nI will write it:\n" + fenced(FINAL) + "and then I ran out of tok"
    ex = extract(text)
    assert ex.error is None
    assert ex.code == FINAL
    assert ex.blocks_seen == 1


def test_unclosed_think_loses_to_answer_before_it():
    text = fenced(DRAFT) + "<think>\n" + fenced(FINAL)
    ex = extract(text)
    assert ex.code == DRAFT
    assert ex.blocks_seen == 1


def test_cpp_block_declaring_modelnew_does_not_win_over_python():
    cpp = "class ModelNew : public torch::nn::Module {\n};\n"
    text = fenced(FINAL) + "And the kernel source:\n" + fenced(cpp, lang="cpp") + fenced("__global__ void k() {}\n", lang="cuda")
    ex = extract(text)
    assert ex.error is None
    assert ex.code == FINAL
    assert ex.blocks_seen == 3


def test_cpp_blocks_before_python_block():
    text = (fenced("#include <torch/extension.h>\n", lang="cpp")
            + fenced("__global__ void k() {}\n", lang="cuda") + fenced(FINAL))
    ex = extract(text)
    assert ex.code == FINAL
    assert ex.blocks_seen == 3


def test_no_block():
    ex = extract("I cannot help with that.")
    assert ex.code is None and ex.code_hash is None
    assert ex.error == "no fenced code block in the completion"
    assert ex.blocks_seen == 0


def test_blocks_without_modelnew():
    ex = extract(fenced("class Model:\n    pass\n") + fenced("echo hi\n", lang="bash"))
    assert ex.code is None
    assert ex.error == "no fenced code block defines class ModelNew (2 blocks seen)"
    assert ex.blocks_seen == 2


def test_syntax_error_names_the_line():
    broken = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x)\n        return x\n"
    ex = extract(fenced(broken))
    assert ex.code is None
    assert ex.error is not None
    assert ex.error.startswith("extracted code does not parse: line 4: ")
    assert ex.blocks_seen == 1


def test_crlf_text_gives_same_hash_as_lf():
    lf = extract(fenced(FINAL))
    crlf = extract(fenced(FINAL).replace("\n", "\r\n"))
    assert crlf.code == lf.code
    assert crlf.code_hash == lf.code_hash


def test_save_is_idempotent(tmp_path):
    ex = extract(fenced(FINAL))
    out = tmp_path / "generated"
    first = save(ex, out)
    mtime = first.stat().st_mtime_ns
    second = save(ex, out)
    assert first == second == out / f"{ex.code_hash}.py"
    assert first.read_text() == FINAL
    assert second.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in out.iterdir()) == [f"{ex.code_hash}.py"]


def test_save_refuses_failed_extraction(tmp_path):
    ex = extract("no code")
    with pytest.raises(ValueError, match="no fenced code block in the completion"):
        save(ex, tmp_path)
    assert list(tmp_path.iterdir()) == []
