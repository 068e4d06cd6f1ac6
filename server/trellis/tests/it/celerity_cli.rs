//! The celerity transformer through the CLI: the transformed blueprint shown, abstract names in plans and events, and the conformance folder of the Celerity documentation's examples.
