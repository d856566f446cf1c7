//! Link measurement: the probe packet format, the reflector's state machine and the
//! statistics `netjam ping` and `netjam sweep` report.
