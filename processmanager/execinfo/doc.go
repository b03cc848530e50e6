// Package execinfo holds what is known about one executable file: its file
// id, its build ids, where its segments load (and so the bias of a mapping
// of it), its function symbols and how their names are demangled, the
// language runtimes recognised in it and, for an APM agent's library, the
// symbols trace correlation reads. It is read once per file identity and
// shared by every process that maps the file; Cache keeps it by identity.
package execinfo
