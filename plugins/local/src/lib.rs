//! Provider `local`: files, directories, random secrets and env files on the
//! local machine. Filled in with the plugin protocol (issue 4).
