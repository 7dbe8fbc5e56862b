"""A Python agent runtime as OpenTelemetry sees it: the openai client, instrumented by
OpenInference, makes CALLS chat completions against a fake model endpoint, and the
OpenTelemetry SDK's OTLP/HTTP exporter sends each span to bandplane's receiver.

Run by cmd/bandplane/otlp_python_integration_test.go in the venv of
deploy/local/otelpy.sh. Environment:

  BANDPLANE_OTLP_ENDPOINT  the receiver, e.g. http://127.0.0.1:PORT/v1/traces
  BANDPLANE_OTLP_TOKEN     an ingest key, sent as Authorization: Bearer
  FAKE_OPENAI_BASE_URL     the fake model endpoint, e.g. http://127.0.0.1:PORT/v1
  SERVICE_NAME             the resource's service.name (what a binding names)
  CALLS                    how many chat completions to make
  MODEL                    the model asked for (default gpt-5.4)

Prints one line of JSON to stdout: the calls made, the spans exported, the export
failures and the spans the receiver rejected (partial success), and per span its
name and the attributes that bandplane maps (never the message content). Exits 1 when
an export failed or the receiver rejected a span, 2 on a bad environment.
"""

import json
import os
import sys
import threading

import openai
import requests
from openinference.instrumentation.openai import OpenAIInstrumentor
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

# The attributes reported in the summary: what bandplane's mapping (ingest/otlp/table.go)
# reads for usage, by prefix. Message content (llm.input_messages.*, input.value) stays out.
REPORTED = ("openinference.span.kind", "llm.model_name", "llm.provider", "llm.system", "llm.token_count.", "gen_ai.")


class RecordingExporter(SpanExporter):
    """Wraps an exporter and records each export's result and the spans it carried:
    the SDK's span processors only log a failed export, which would leave this process
    exiting 0."""

    def __init__(self, inner):
        self.inner = inner
        self.lock = threading.Lock()
        self.exported = 0
        self.failures = 0
        self.spans = []

    def export(self, spans):
        try:
            result = self.inner.export(spans)
        except Exception as e:  # an exporter that raises has failed too
            print(f"chat.py: export raised: {e!r}", file=sys.stderr)
            result = SpanExportResult.FAILURE
        with self.lock:
            if result == SpanExportResult.SUCCESS:
                self.exported += len(spans)
            else:
                self.failures += 1
            for s in spans:
                attrs = {k: v for k, v in (s.attributes or {}).items() if k.startswith(REPORTED)}
                self.spans.append({"name": s.name, "attributes": attrs})
        return result

    def shutdown(self):
        self.inner.shutdown()

    def force_flush(self, timeout_millis=30000):
        return self.inner.force_flush(timeout_millis)


class PartialSuccess:
    """A requests response hook reading the receiver's ExportTraceServiceResponse: the
    exporter counts an HTTP 200 as success and never looks at the partial success in its
    body, where bandplane reports the spans it rejected (unattributed, malformed)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.rejected = 0
        self.messages = []

    def __call__(self, response, *args, **kwargs):
        if response.status_code != 200 or not response.content:
            return
        answer = ExportTraceServiceResponse()
        try:
            answer.ParseFromString(response.content)
        except Exception as e:
            print(f"chat.py: cannot parse the export response ({len(response.content)} bytes): {e!r}", file=sys.stderr)
            return
        with self.lock:
            self.rejected += answer.partial_success.rejected_spans
            if answer.partial_success.error_message:
                self.messages.append(answer.partial_success.error_message)


def env(name):
    value = os.environ.get(name, "")
    if not value:
        print(f"chat.py: environment variable {name} is not set", file=sys.stderr)
        sys.exit(2)
    return value


def main():
    endpoint = env("BANDPLANE_OTLP_ENDPOINT")
    token = env("BANDPLANE_OTLP_TOKEN")
    base_url = env("FAKE_OPENAI_BASE_URL")
    service = env("SERVICE_NAME")
    calls = int(env("CALLS"))
    model = os.environ.get("MODEL") or "gpt-5.4"

    partial = PartialSuccess()
    session = requests.Session()
    session.hooks["response"].append(partial)
    exporter = RecordingExporter(
        OTLPSpanExporter(endpoint=endpoint, headers={"Authorization": "Bearer " + token}, timeout=10, session=session)
    )
    tp = TracerProvider(resource=Resource.create({"service.name": service}))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=tp)

    client = openai.OpenAI(api_key="test", base_url=base_url, max_retries=0, timeout=10)
    for i in range(calls):
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"call {i}: say ok"}],
        )

    flushed = tp.force_flush(timeout_millis=10_000)
    tp.shutdown()
    instrumentor.uninstrument()

    summary = {
        "calls": calls,
        "service": service,
        "exported_spans": exporter.exported,
        "export_failures": exporter.failures,
        "flushed": flushed,
        "rejected_spans": partial.rejected,
        "partial_success": partial.messages,
        "spans": exporter.spans,
    }
    print(json.dumps(summary, sort_keys=True))
    if exporter.failures or partial.rejected or not flushed:
        sys.exit(1)


if __name__ == "__main__":
    main()
