"""`dllm-rl serve MODEL`: an OpenAI-compatible HTTP server over the continuous-batching engine.

:mod:`~dllm_rl.serve.worker` owns the engine on one background thread (the only one that touches the model) and
steps it while requests are held; :mod:`~dllm_rl.serve.app` is the FastAPI application (``/v1/completions``,
``/v1/chat/completions``, ``/health``, ``/metrics``) that turns HTTP requests into engine requests and their
results (or, streaming, the answer's text as it commits) back into responses, behind the guards of
:mod:`~dllm_rl.serve.guards` (the body's size limit, the API key), which look at a request before its body is read,
with the framework's own refusals in OpenAI's error shape (:mod:`~dllm_rl.serve.http_errors`);
:mod:`~dllm_rl.serve.cli` runs it under uvicorn on the socket :mod:`~dllm_rl.serve.listen` binds before the model
loads, whose shutdown answers the requests still held when the grace period ends.
"""
