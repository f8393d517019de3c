"""Serving requests in turn: the engine over a model backend, memory across requests, chat
templates, jobs, and the OpenAI-compatible HTTP application (``serving.app``, extra ``serve``)."""

from ngramcache.serving.engine import ChatTemplate, Engine, EngineError, Job, JobResult, Memory, vocab_fingerprint

__all__ = ["Memory", "Engine", "Job", "JobResult", "ChatTemplate", "EngineError", "vocab_fingerprint"]
