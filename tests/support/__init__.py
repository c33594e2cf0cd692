"""Helpers shared by test modules (fixtures, gateways in-process, assertion rules). Test modules
import from here, never from one another."""
