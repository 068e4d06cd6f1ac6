//! Client commands (plan, deploy, destroy, instances, instance, events, drift) that talk to a
//! running engine over the engine API.
