"""Messages to a prompt with a model's own chat template."""

from __future__ import annotations

__all__ = ["ChatTemplate"]


class ChatTemplate:
    """Messages to a prompt with a model's own chat template (Jinja2, rendered by
    llama-cpp-python's ``Jinja2ChatFormatter``, as its server does)."""

    def __init__(self, template: str, bos_token: str, eos_token: str):
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self.template = template
        self.bos_token = bos_token
        self._formatter = Jinja2ChatFormatter(template=template, eos_token=eos_token, bos_token=bos_token)

    @classmethod
    def of(cls, llm, template: str | None = None) -> "ChatTemplate | None":
        """The template of ``llm``'s GGUF (``tokenizer.chat_template``) or ``template``;
        None when the model has none."""
        template = template or llm.metadata.get("tokenizer.chat_template")
        if not template:
            return None
        model = llm._model

        def text(tok: int) -> str:
            return model.token_get_text(tok) if tok != -1 else ""

        return cls(template, text(llm.token_bos()), text(llm.token_eos()))

    def tokenize(self, llm, text: str):
        """``text`` (a rendered prompt) as ``llm``'s token ids: :func:`tokenize_rendered`."""
        return tokenize_rendered(llm, text, self.bos_token)

    def render(self, messages: list[dict]) -> str:
        """The prompt for ``messages`` (``role`` and ``content`` each), ending where the
        assistant's answer starts. A template error is a ValueError."""
        try:
            return self._formatter(messages=messages).prompt
        except Exception as e:  # jinja2 errors and the template's own raise_exception
            raise ValueError(f"the chat template cannot render these messages: {e}") from None


def tokenize_rendered(llm, text: str, bos_token: str):
    """``text`` as ``llm``'s token ids (int32), as serve reads a prompt: special tokens parsed,
    and a BOS added only where the text does not already start with ``bos_token`` (the one a
    chat template writes; "" when there is none)."""
    import numpy as np

    add_bos = not (bos_token and text.startswith(bos_token))
    return np.asarray(llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True), dtype=np.int32)
