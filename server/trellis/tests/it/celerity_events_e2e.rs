//! The celerity transformer end to end against moto: APIs, consumers and schedules that trigger handlers.
