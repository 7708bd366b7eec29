"""Placeholder router: filled in by its issue's work."""

from fastapi import APIRouter

router = APIRouter()
