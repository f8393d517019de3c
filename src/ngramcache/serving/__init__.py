"""Serving requests in turn: the engine over a model backend (``engine``), what the
drafters learn across requests (``memory``), chat templates, jobs, stop strings, typed
errors, and the OpenAI-compatible HTTP application (``serving.app``, extra ``serve``)."""

from ngramcache.serving.chat_template import ChatTemplate
from ngramcache.serving.engine import Engine
from ngramcache.serving.errors import EngineError
from ngramcache.serving.jobs import Job, JobResult
from ngramcache.serving.memory import Memory, vocab_fingerprint

__all__ = ["Memory", "Engine", "Job", "JobResult", "ChatTemplate", "EngineError", "vocab_fingerprint"]
