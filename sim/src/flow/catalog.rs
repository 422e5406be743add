//! What the simulator's flows are made of: the compiled flows on offer, their steps, and
//! the capabilities and topics they draw from.

/// One step of a compiled flow: a capability the kernel authorizes and executes.
pub(super) struct Step {
    pub(super) name: &'static str,
    pub(super) capability: &'static str,
    pub(super) artifact_type: &'static str,
    /// Tool latency range, milliseconds.
    pub(super) latency_ms: (i64, i64),
}

/// A compiled flow ChainWeaver can run, and contextweaver can offer as a choice.
pub(super) struct Template {
    pub(super) name: &'static str,
    pub(super) label: &'static str,
    pub(super) description: &'static str,
    pub(super) version: &'static str,
    pub(super) steps: &'static [Step],
}

pub(super) const RESEARCH_DOCS: Step = Step {
    name: "research",
    capability: "org.weaver.search_docs",
    artifact_type: "application/json",
    latency_ms: (80, 600),
};
pub(super) const RESEARCH_WEB: Step = Step {
    name: "research",
    capability: "org.weaver.web_search",
    artifact_type: "text/html",
    latency_ms: (150, 900),
};
pub(super) const CODEGEN: Step = Step {
    name: "codegen",
    capability: "org.weaver.generate_code",
    artifact_type: "text/x-python",
    latency_ms: (900, 4000),
};
pub(super) const TESTS: Step = Step {
    name: "test",
    capability: "org.weaver.run_tests",
    artifact_type: "text/plain",
    latency_ms: (500, 3000),
};
pub(super) const FETCH: Step = Step {
    name: "fetch",
    capability: "org.weaver.fetch_page",
    artifact_type: "text/html",
    latency_ms: (50, 400),
};
pub(super) const SUMMARIZE: Step = Step {
    name: "summarize",
    capability: "org.weaver.summarize",
    artifact_type: "application/json",
    latency_ms: (400, 2000),
};

/// The flows on offer; the first is the seed scenario (research, then code generation).
pub(super) const TEMPLATES: [Template; 3] = [
    Template {
        name: "research_then_codegen",
        label: "Research, then generate code",
        description: "Search the documentation, then generate code from what was found.",
        version: "1.4.0",
        steps: &[RESEARCH_DOCS, CODEGEN],
    },
    Template {
        name: "research_codegen_test",
        label: "Research, generate code, run the tests",
        description: "Search the web, generate code, then run the test suite on it.",
        version: "2.0.1",
        steps: &[RESEARCH_WEB, CODEGEN, TESTS],
    },
    Template {
        name: "fetch_then_summarize",
        label: "Fetch a page and summarize it",
        description: "Fetch a known page, then summarize it for the user.",
        version: "0.9.3",
        steps: &[FETCH, SUMMARIZE],
    },
];

/// Capabilities no template uses: what an out-of-scope token holds instead.
pub(super) const UNRELATED_SCOPE: [&str; 2] = ["org.weaver.read_file", "org.weaver.list_files"];

pub(super) const TOPICS: [&str; 6] = [
    "retry configuration",
    "exponential backoff",
    "dead letter queues",
    "rate limiting",
    "idempotent consumers",
    "schema evolution",
];
